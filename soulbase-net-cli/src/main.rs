//! `soulbase-net`: see the library's documentation, or run `soulbase-net help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    #[allow(
        clippy::print_stdout,
        clippy::print_stderr,
        reason = "a command-line tool"
    )]
    match soulbase_net_cli::run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
