//! The piped chat input reader over seeded random bytes (valid and broken UTF-8, `\r`, `\n`, NUL):
//! it never panics, returns every line exactly as an independent split on `\n` gives it, and names
//! the offset of the first bad byte of each line that is not UTF-8.
use inkling_wgpu::cli::chat::read_input_line;

/// splitmix64: deterministic and good enough to pick bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random input: ASCII, newlines, CR, NUL, whole multi-byte characters, lone continuation and
/// lead bytes, overlong and surrogate encodings.
fn input(rng: &mut Rng) -> Vec<u8> {
    let pieces: [&[u8]; 12] = [
        b"a",
        b"Hello ",
        b"\n",
        b"\r\n",
        b"\0",
        "é".as_bytes(),
        "😀".as_bytes(),
        b"\x80",
        b"\xc3",
        b"\xff\xfe",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
    ];
    let n = (rng.next() % 40) as usize;
    (0..n)
        .flat_map(|_| pieces[(rng.next() % pieces.len() as u64) as usize].to_vec())
        .collect()
}

#[test]
fn the_chat_input_reader_returns_every_line_or_its_first_bad_byte() {
    let mut rng = Rng(0x1a2b_3c4d);
    for case in 0..3000 {
        let bytes = input(&mut rng);
        let mut want = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let end = rest
                .iter()
                .position(|&b| b == b'\n')
                .map_or(rest.len(), |i| i + 1);
            let (line, tail) = rest.split_at(end);
            want.push(match std::str::from_utf8(line) {
                Ok(s) => Ok(s.trim_end_matches(['\n', '\r']).to_string()),
                Err(e) => Err(e.valid_up_to()),
            });
            rest = tail;
        }
        let mut r = std::io::Cursor::new(bytes.clone());
        let mut got = Vec::new();
        while let Some(line) = read_input_line(&mut r).unwrap() {
            got.push(line);
        }
        assert_eq!(got, want, "case {case}: {bytes:?}");
    }
}
