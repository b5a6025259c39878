//! `spillway`: the Spillway gateway for Linux.
//!
//! `spillway run` serves the protocol on TCP and Unix sockets and serial ports, keeps the
//! log in a flash image file, and serves Prometheus metrics; `spillway inspect IMAGE`
//! verifies an image; `spillway validate --config FILE` checks a configuration. Exit codes
//! are listed by `spillway --help` and in the library's documentation.

mod app;

use clap::Parser;

use app::config::{Cli, Command};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .init();
    let cli = Cli::parse();
    if cli.version {
        println!("{}", app::version());
        return;
    }
    let result = match cli.command {
        Some(Command::Run(args)) => app::run(*args),
        Some(Command::Inspect { image, json }) => app::inspect::inspect(&image, json),
        Some(Command::Validate { config }) => app::validate(config),
        None => {
            eprintln!("spillway: a command is needed (run, inspect, validate); see --help");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        log::error!("{e}");
        std::process::exit(e.exit_code());
    }
}
