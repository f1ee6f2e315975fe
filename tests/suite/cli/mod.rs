//! The command line end to end: generate, perplexity, output conventions, validation of flags, the bundled model, the benches and smoke, info, the benches' scripts.

pub mod bench_cli;
pub mod bundled_model;
pub mod cli_output;
pub mod cli_prompt;
pub mod cli_validation;
pub mod gemv_cli;
pub mod generate_cli;
pub mod info_cli;
pub mod mlx_script;
pub mod perplexity_cli;
