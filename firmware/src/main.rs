//! `spillway`: the Spillway gateway for Linux.
//!
//! `spillway run` serves the protocol on TCP and Unix sockets and serial ports, keeps the
//! log in a flash image file, and serves Prometheus metrics; `spillway inspect IMAGE`
//! verifies an image; `spillway validate --config FILE` checks a configuration. Exit codes
//! are listed by `spillway --help` and by each subcommand's `--help`.

mod app;

use clap::Parser;

use app::config::{Cli, Command, RunArgs};

fn main() {
    let cli = Cli::parse();
    // The config file is read once, here: `log_level` and the settings both take it, and a
    // pipe (`--config <(…)`) reads empty the second time. One that cannot be read is
    // reported by the settings.
    let config = match &cli.command {
        Some(Command::Run(args)) => args.config.as_deref(),
        Some(Command::Validate { config }) => Some(config.as_path()),
        _ => None,
    };
    if let Some(path) = config {
        let _ = spillway_core::cli::layer::load(path);
    }
    // `--log-level` (or the config file's `log-level`), overridden by RUST_LOG when set.
    let level = match &cli.command {
        Some(Command::Run(args)) => app::config::log_level(args),
        Some(Command::Validate { config }) => app::config::log_level(&RunArgs {
            config: Some(config.clone()),
            ..RunArgs::default()
        }),
        _ => app::config::LogLevelArg::Info,
    };
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(level.as_str());
    if let Ok(filters) = std::env::var("RUST_LOG")
        && !filters.is_empty()
    {
        logger.parse_filters(&filters);
    }
    logger.target(env_logger::Target::Stderr).init();
    if cli.version {
        println!("{}", app::version());
        return;
    }
    let result = match cli.command {
        Some(Command::Run(args)) => app::run(*args),
        Some(Command::Inspect { image, json }) => app::inspect::inspect(&image, json),
        Some(Command::Validate { config }) => app::validate(config),
        Some(Command::Token { file, name, roles }) => {
            app::auth::token_command(&file, &name, &roles)
        }
        None => {
            eprintln!("spillway: a command is needed (run, inspect, validate, token); see --help");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        log::error!("{e}");
        std::process::exit(e.exit_code());
    }
}
