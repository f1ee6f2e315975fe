//! The run-time status words a GPU step leaves next to its greedy id, and the error they turn into.
//!
//! The buffer (u32 [4]) is written by kernels that already read the values, so checking costs no
//! extra pass: word [`ID`] is the greedy id (`wgsl/elementwise.wgsl` argmax), word [`LOGITS_BAD`]
//! is set to 1 by the argmax when a logit is NaN or ±Inf, word [`ROUTER_LAYER`] is `layer + 1` of
//! the first layer whose router saw a non-finite logit, and word [`ROUTER_TOKEN`] is
//! `u32::MAX − position` of the first such token (`wgsl/router.wgsl`). The words are sticky: the
//! host clears words 1..4 when a call starts feeding tokens and reads them with its result.
use super::error::ModelError;

/// Words in the status buffer.
pub const WORDS: usize = 4;
/// The greedy id of the step.
pub const ID: usize = 0;
/// 1 when a logit seen by the argmax was NaN or ±Inf.
pub const LOGITS_BAD: usize = 1;
/// `layer + 1` of the first layer whose router logits held a NaN or an Inf (0 = none).
pub const ROUTER_LAYER: usize = 2;
/// `u32::MAX − position` of the first token with non-finite router logits at that layer.
pub const ROUTER_TOKEN: usize = 3;

/// The error for the status `words` read after a step whose last token is at `last` (0-based
/// absolute position), if any. A router error comes first: it names the earliest layer, where the
/// damage entered.
pub fn check(words: &[u32], last: usize) -> Result<(), ModelError> {
    if words[ROUTER_LAYER] != 0 {
        return Err(ModelError::NonFiniteRouter {
            position: (u32::MAX - words[ROUTER_TOKEN]) as usize,
            layer: words[ROUTER_LAYER] as usize - 1,
        });
    }
    if words[LOGITS_BAD] != 0 {
        return Err(ModelError::NonFiniteLogits { position: last });
    }
    Ok(())
}

/// The error for logits rows `rows` (each `width` values; row r belongs to position `p_first + r`)
/// holding a NaN or an Inf, naming the first such position (a host-side check of logits that are
/// read back anyway).
pub fn check_logits(rows: &[f32], width: usize, p_first: usize) -> Result<(), ModelError> {
    match rows.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(ModelError::NonFiniteLogits {
            position: p_first + i / width.max(1),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_words_name_the_first_token_and_layer() {
        // the first bad router token is at position 12, layer 4
        let e = check(&[7, 1, 5, u32::MAX - 12], 14).unwrap_err();
        assert_eq!(
            e.to_string(),
            "non-finite value in the forward pass at position 12: the router logits of layer 4 \
             hold a NaN or an Inf (damaged weights or activations; `inkling-wgpu info --verify` \
             scans every tensor of the model)"
        );
        let e = check(&[7, 1, 0, 0], 14).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("non-finite logit at position 14:"));
        assert!(check(&[7, 0, 0, 0], 14).is_ok());
        let e = check_logits(&[0.0, 1.0, 2.0, f32::NAN], 2, 3).unwrap_err();
        assert!(e.to_string().starts_with("non-finite logit at position 4:"));
    }
}
