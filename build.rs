//! Generates the gRPC code from the vendored protos with protox (a pure-Rust protobuf
//! compiler), so building needs cargo alone and no system protoc:
//! * the CRI `runtime.v1` client and server (`proto/api.proto`);
//! * containerd's events service client and task event messages (`proto/containerd/`, the
//!   v1.6.20 protos under their own import paths; see `proto/README.md`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    println!("cargo:rerun-if-changed=proto/containerd");
    let fds = protox::compile(["api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;

    // containerd.services.events.v1 (Events/Subscribe) and containerd.events (TaskExit, ...):
    // the client only; google.protobuf types come from prost-types.
    let fds = protox::compile(
        [
            "github.com/containerd/containerd/api/services/events/v1/events.proto",
            "github.com/containerd/containerd/api/events/task.proto",
        ],
        ["proto/containerd"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
