//! Generates the CRI `runtime.v1` client and server from the vendored proto with protox
//! (a pure-Rust protobuf compiler), so building needs cargo alone and no system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let fds = protox::compile(["api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
