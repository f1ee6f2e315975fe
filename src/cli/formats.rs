//! `inkling-wgpu formats`: print the weight-format registry (FORMATS.md).
use super::output::out;
use crate::formats::{ScaleLayout, REGISTRY};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {}

/// The registry as an aligned text table.
pub fn table() -> String {
    let mut out = format!(
        "{:>7}  {:<14} {:<15} {:>12}  {:<36} {}\n",
        "ordinal", "name", "bytes/row", "@ I=6144", "scales", "GPU kernel here"
    );
    for s in REGISTRY {
        let gs = s.group_sizes.first().copied().unwrap_or(0) as usize;
        let scales = match s.scales {
            ScaleLayout::None => "none".to_string(),
            ScaleLayout::PerRow => "[O] f32".to_string(),
            ScaleLayout::PerGroup if s.group_sizes.len() == 1 => {
                format!("[O][ceil(I/{})] f32", s.group_sizes[0])
            }
            ScaleLayout::PerGroup => format!("[O][ceil(I/gs)] f32, gs {:?}", s.group_sizes),
            ScaleLayout::Embedded => "embedded in rows".to_string(),
            ScaleLayout::Block128 => "[O/128][I/128] f32".to_string(),
        };
        out.push_str(&format!(
            "{:>7}  {:<14} {:<15} {:>12}  {:<36} {}\n",
            s.ordinal,
            s.name,
            s.bytes_per_row,
            s.format.bytes_per_row(6144, gs),
            scales,
            if s.gpu_kernel { "yes" } else { "no" }
        ));
    }
    out.push_str(
        "private work-in-progress ordinals start at 100; see FORMATS.md for the exact layouts\n",
    );
    out
}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    out!("{}", table())?;
    Ok(ExitCode::SUCCESS)
}
