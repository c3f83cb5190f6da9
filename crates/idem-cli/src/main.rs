//! The `idem` command. Parses arguments, sets up logging, and hands over to
//! [`commands`].

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
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", commands::error_text(&error));
            commands::exit_code(&error)
        }
    }
}
