//! `soulbase-outbox`: an outbox's dead letters, by hand (see
//! [`soulbase_net_outbox::admin`]).

use std::process::ExitCode;

#[allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command: its lines go to stdout, its errors to stderr"
)]
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("soulbase-outbox: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(soulbase_net_outbox::admin::run(&args)) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("soulbase-outbox: {e}");
            ExitCode::from(2)
        }
    }
}
