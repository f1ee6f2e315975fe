//! The piped chat input reader over seeded random bytes (valid and broken UTF-8, `\r`, `\n`, NUL):
//! it never panics, returns every line exactly as an independent split on `\n` gives it, and names
//! the offset of the first bad byte of each line that is not UTF-8.
use crate::ops_util::Rng;
use inkling_wgpu::cli::chat::read_input_line;

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
    let n = (rng.next_u64() % 40) as usize;
    (0..n)
        .flat_map(|_| pieces[(rng.next_u64() % pieces.len() as u64) as usize].to_vec())
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
