//! The `ctxproxy` binary: a thin CLI over the library (`serve`, `check-config`, `migrate`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ctxproxy::app::{Server, config_path, load_config, shutdown_signal};
use ctxproxy::config::Config;

#[derive(Parser)]
#[command(
    name = "ctxproxy",
    version,
    about = "A context-managing proxy for OpenAI-compatible APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The server file (default config/ctxproxy.yaml, or CTXPROXY_CONFIG).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Load the server file and every tenant file and report every problem.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply pending database migrations and exit.
    Migrate {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ctxproxy::telemetry::init_logging();
    match cli.command {
        Command::CheckConfig { config } => check_config(config_path(config)),
        Command::Serve { config } => run_async(serve(config_path(config))),
        Command::Migrate { config } => run_async(migrate(config_path(config))),
    }
}

fn run_async(fut: impl std::future::Future<Output = ctxproxy::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("ctxproxy: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(path: PathBuf) -> ctxproxy::Result<()> {
    ctxproxy::install_crypto_provider();
    let config = load_config(&path)?;
    let server = Server::bind(config, None).await?;
    tracing::info!(addr = %server.local_addr()?, config = %path.display(), "ctxproxy listening");
    let store = server.store();
    let served = server.run(shutdown_signal()).await;
    // As `migrate` does: SQLite then empties its write-ahead log into the database file, so
    // the file is whole on its own once the process has stopped.
    store.close().await;
    served
}

/// Reads only the server file's database: tenant files are no business of a migration.
async fn migrate(path: PathBuf) -> ctxproxy::Result<()> {
    let database = Config::load_database(&path).map_err(|failed| {
        let problems: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
        ctxproxy::Error::Config(problems.join("\n"))
    })?;
    let url = ctxproxy::config::printable_url(&database.url);
    let store = ctxproxy::app::open_database(&database).await?;
    // Closed, not dropped: SQLite copies its write-ahead log into the database file when the
    // last connection closes, so the file is whole on its own (copied or shipped, say).
    store.close().await;
    tracing::info!(%url, "migrations applied");
    println!("migrations applied to {url}");
    Ok(())
}

fn check_config(path: PathBuf) -> ExitCode {
    use std::fmt::Write as _;
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let mut out = String::new();
    let code = match Config::load(&path) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                let _ = writeln!(out, "warning: {w}");
            }
            let c = &loaded.config;
            let (tenants, models) = (c.tenants.len(), c.server.models.0.len());
            let _ = writeln!(
                out,
                "ok: {} ({tenants} tenant{}, {models} model pattern{})",
                path.display(),
                plural(tenants),
                plural(models),
            );
            ExitCode::SUCCESS
        }
        Err(failed) => {
            for p in &failed.problems {
                let _ = writeln!(out, "{p}");
            }
            for w in &failed.warnings {
                let _ = writeln!(out, "warning: {w}");
            }
            let n = failed.problems.len();
            let _ = writeln!(out, "{n} problem{} found", plural(n));
            ExitCode::FAILURE
        }
    };
    // One write, and a reader that went away (`check-config | head`) is not a crash: the exit
    // code still says whether the configuration is valid.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    code
}
