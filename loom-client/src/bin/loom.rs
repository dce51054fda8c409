//! `loom`: loom's command-line tool. Everything is in `pgloom::cli`.

fn main() -> std::process::ExitCode {
    pgloom::cli::main()
}
