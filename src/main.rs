use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = inkling_wgpu::cli::Cli::parse();
    match inkling_wgpu::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
