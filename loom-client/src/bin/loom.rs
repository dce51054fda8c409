//! `loom`: loom's command-line tool. Everything is in `loom_client::cli`.

fn main() -> std::process::ExitCode {
    loom_client::cli::main()
}
