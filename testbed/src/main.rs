//! `reaplet-demo`: the demo on a private containerd ([`reaplet_testbed::demo`]); scripts/demo.sh
//! starts the test bed and runs it. Exits 64 on a bad flag, 1 when the demo fails.

use clap::Parser;
use std::io::Write as _;

/// Demonstrate reaplet's pipeline on a private containerd (see scripts/demo.sh).
#[derive(Parser)]
#[command(name = "reaplet-demo", version)]
struct Cli {
    #[command(flatten)]
    args: reaplet_testbed::demo::DemoArgs,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(64)
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0)
        }
    };
    reaplet::logs::init_logs(reaplet::config::LogFormat::Auto);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("reaplet-demo: starting the async runtime: {e}");
            std::process::exit(1)
        }
    };
    match rt.block_on(reaplet_testbed::demo::command(cli.args)) {
        Ok(report) => {
            // a reader that went away (EPIPE) ends the output quietly
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(report.as_bytes()).and_then(|()| out.flush());
        }
        Err(e) => {
            eprintln!("reaplet-demo: {e}");
            std::process::exit(1)
        }
    }
}
