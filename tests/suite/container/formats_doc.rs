//! FORMATS.md is the registry: its table must equal `REGISTRY` row by row.

use inkling_wgpu::formats::{ScaleLayout, REGISTRY};

struct DocRow {
    ordinal: u32,
    name: String,
    bytes: String,
    scales: String,
    kernel: bool,
}

fn doc_rows() -> Vec<DocRow> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("FORMATS.md");
    let text = std::fs::read_to_string(path).expect("FORMATS.md at the crate root");
    let mut lines = text.lines().skip_while(|l| !l.starts_with("| ordinal |"));
    let header = lines
        .next()
        .expect("FORMATS.md has a table starting `| ordinal |`");
    let cols: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(
        cols,
        [
            "ordinal",
            "name",
            "bytes per row of an [O, I] matrix",
            "scales",
            "dequantisation",
            "GPU kernel here"
        ]
    );
    lines.next(); // |---|
    lines
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let c: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(c.len(), 6, "row {l:?}");
            DocRow {
                ordinal: c[0].parse().unwrap_or_else(|_| panic!("ordinal in {l:?}")),
                name: c[1].to_string(),
                bytes: c[2].to_string(),
                scales: c[3].to_string(),
                kernel: match c[5] {
                    "yes" => true,
                    "no" => false,
                    k => panic!("kernel column must be yes/no, got {k:?}"),
                },
            }
        })
        .collect()
}

/// Evaluate a bytes-per-row formula: a product (`·`) of integers, `I` and `ceil(I/N)`.
fn eval(formula: &str, i: usize) -> usize {
    formula
        .split('·')
        .map(|t| {
            let t = t.trim();
            if t == "I" {
                i
            } else if let Some(inner) = t.strip_prefix("ceil(I/").and_then(|r| r.strip_suffix(')'))
            {
                i.div_ceil(
                    inner
                        .parse::<usize>()
                        .unwrap_or_else(|_| panic!("bad divisor in {formula:?}")),
                )
            } else {
                t.parse()
                    .unwrap_or_else(|_| panic!("cannot evaluate term {t:?} of {formula:?}"))
            }
        })
        .product()
}

#[test]
fn formula_evaluator_works() {
    assert_eq!(eval("4·I", 7), 28);
    assert_eq!(eval("ceil(I/64)·24", 65), 48);
    assert_eq!(eval("ceil(I/2)", 7), 4);
    assert_eq!(eval("I", 9), 9);
}

#[test]
fn formats_md_table_equals_registry() {
    let rows = doc_rows();
    assert_eq!(
        rows.len(),
        REGISTRY.len(),
        "FORMATS.md rows vs REGISTRY entries"
    );
    for (d, s) in rows.iter().zip(REGISTRY) {
        assert_eq!(d.ordinal, s.ordinal, "ordinal of {}", s.name);
        assert_eq!(d.ordinal, s.format.ordinal());
        assert_eq!(d.name, s.name, "name of ordinal {}", s.ordinal);
        assert_eq!(d.kernel, s.gpu_kernel, "kernel column of {}", s.name);
        assert_eq!(d.bytes, s.bytes_per_row, "bytes/row formula of {}", s.name);
        let gs = s.group_sizes.first().copied().unwrap_or(0) as usize;
        for i in [1usize, 7, 63, 64, 65, 100, 129, 6144] {
            assert_eq!(
                eval(&d.bytes, i),
                s.format.bytes_per_row(i, gs),
                "bytes per row of {} at I = {i}: doc {:?}",
                s.name,
                d.bytes
            );
        }
        let doc_scales = if d.scales == "none" {
            ScaleLayout::None
        } else if d.scales.starts_with("embedded") {
            ScaleLayout::Embedded
        } else if d.scales.starts_with("[O] f32") {
            ScaleLayout::PerRow
        } else if d.scales.starts_with("[O][ceil(I/") {
            ScaleLayout::PerGroup
        } else if d.scales.starts_with("[ceil(O/128)][ceil(I/128)]") {
            ScaleLayout::Block128
        } else {
            panic!("unknown scales text {:?}", d.scales)
        };
        assert_eq!(doc_scales, s.scales, "scales of {}", s.name);
    }
    // ordinals are 0..9 in order; private work in progress starts at 100
    assert_eq!(
        rows.iter().map(|r| r.ordinal).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
}

#[test]
fn formats_md_states_the_rules() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("FORMATS.md"),
    )
    .unwrap();
    assert!(text.contains("from 100 up"));
    assert!(text.contains("## Container"));
    assert!(text.contains("absmax / qmax"));
}
