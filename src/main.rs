use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = inkling_wgpu::cli::Cli::parse();
    match inkling_wgpu::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // The chain, skipping a cause whose text its parent already quotes.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            eprintln!("error: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}
