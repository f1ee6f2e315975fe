use clap::Parser;

fn main() -> std::process::ExitCode {
    inkling_wgpu::gpu::device::quiet_mesa_device_select();
    let cli = inkling_wgpu::cli::Cli::parse();
    match inkling_wgpu::cli::run(cli) {
        Ok(code) => code,
        Err(e) if inkling_wgpu::cli::output::is_broken_pipe(&e) => {
            inkling_wgpu::cli::output::exit_broken_pipe()
        }
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
