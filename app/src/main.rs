//! `latent-studio`: the desktop studio (no subcommand) and its command line ([`cli`]).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
