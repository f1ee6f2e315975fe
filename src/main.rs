use clap::Parser;

/// Set `NODEVICE_SELECT=1` unless the user has set it: Mesa's device-select Vulkan layer otherwise
/// prints `error: XDG_RUNTIME_DIR is invalid or not set` where that variable is missing (a
/// harmless message that reads like a failure), and the layer's choice is not needed since the
/// engine chooses the adapter itself. Called first in `main`, before any thread exists (it changes
/// the process environment).
fn quiet_mesa_device_select() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

fn main() -> std::process::ExitCode {
    quiet_mesa_device_select();
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
            // never a panic when stderr is gone (a closed pipe ends the process as SIGPIPE)
            inkling_wgpu::cli::output::write_stderr(format_args!("error: {msg}\n"));
            // a bad command-line value found after parsing exits as clap's own errors do
            if e.downcast_ref::<inkling_wgpu::cli::context::BadArgument>()
                .is_some()
            {
                std::process::ExitCode::from(2)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}
