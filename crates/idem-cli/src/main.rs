//! The `idem` command. Parses arguments, sets up logging, and hands the
//! command over to [`cli::Cli::run`].

mod cli;
mod commands;
mod telemetry;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let _telemetry = telemetry::install(&cli.telemetry);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start the async runtime");
    match runtime.block_on(cli.run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", commands::error_text(&error));
            commands::exit_code(&error)
        }
    }
}
