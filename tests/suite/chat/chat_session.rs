//! The chat's KV continuation: a turn that prefills only its new tokens (KV cache and conv states
//! kept) gives what a fresh prefill of the whole conversation gives, on the CPU and the GPU, with
//! and without a repeat penalty.
use crate::chat_common::{chat_model, stop_ids, tokenizer_and_renderer};
use crate::model_common::{greedy, rel_err};
use inkling_wgpu::chat::session::{Finish, Halt, Session};
use inkling_wgpu::chat::{Effort, Message, Renderer, Role};
use inkling_wgpu::gpu::device::Gpu;
use inkling_wgpu::model::generate::generate;
use inkling_wgpu::model::sampling::WHOLE_SEQUENCE;
use inkling_wgpu::model::{Checkpoint, CpuModel, Forward, GpuModel, GpuModelOptions, Weights};

/// The prompt of the next turn: `prompt`, the model's `answer`, the tokens that close its turn, a
/// user message `text` and the generation prompt (effort none).
fn next_turn(r: &Renderer, prompt: &[u32], answer: &[u32], text: &str) -> Vec<u32> {
    let effort = Some(Effort::NONE);
    let mut p = prompt.to_vec();
    p.extend(answer);
    p.extend(r.close_model_turn(&p));
    p.extend(r.message(&Message::new(Role::User, text)).unwrap());
    p.extend(r.generation_prompt(effort));
    p
}

fn check_continuation(model: &mut dyn Forward, eos: &[u32]) {
    let (_, r) = tokenizer_and_renderer();
    let effort = Some(Effort::NONE);
    let user = |s: &str| r.message(&Message::new(Role::User, s)).unwrap();
    let mut p1 = r
        .render(&[Message::new(Role::System, "Be brief.")], effort)
        .unwrap();
    p1.extend(user("Once upon a time"));
    p1.extend(r.generation_prompt(effort));
    let params = greedy(eos.to_vec(), 12);

    // turn by turn through a session
    let (t1, t2, p2) = {
        let mut s = Session::new(model);
        let t1 = s.generate(&p1, &params, &mut |_| Ok(())).unwrap();
        assert_eq!(t1.reused, 0);
        let p2 = next_turn(&r, &p1, &t1.generated_ids, "the fox ran");
        let t2 = s.generate(&p2, &params, &mut |_| Ok(())).unwrap();
        assert!(
            t2.reused >= p1.len() + t1.generated_ids.len() - 1,
            "turn 2 reused {} tokens of {}",
            t2.reused,
            p2.len()
        );
        assert_eq!(t2.stats.prompt_tokens, p2.len() - t2.reused);
        // a prompt that does not extend the held sequence starts over
        let t3 = s.generate(&p1, &params, &mut |_| Ok(())).unwrap();
        assert_eq!(t3.reused, 0);
        assert_eq!(t3.generated_ids, t1.generated_ids);
        // a halted turn keeps a consistent state: the next turn reuses it and agrees
        let mut n = 0;
        let h = s
            .generate(&p2, &params, &mut |_| {
                n += 1;
                if n == 3 {
                    Err(Halt::Cancelled.into())
                } else {
                    Ok(())
                }
            })
            .unwrap();
        assert_eq!(h.finish, Finish::Halted(Halt::Cancelled));
        assert_eq!(h.generated_ids, t2.generated_ids[..3]);
        // (the GPU's pipelined decode has already fed the third id: the next prompt must add
        // tokens after it, as a chat's closing tokens and next message do)
        let p3 = next_turn(&r, &p2, &h.generated_ids, "and then");
        let t4 = s.generate(&p3, &params, &mut |_| Ok(())).unwrap();
        assert!(t4.reused > p2.len(), "reused {}", t4.reused);
        let fresh4 = generate(s.model(), &p3, &params, &mut |_| Ok(())).unwrap();
        assert_eq!(t4.generated_ids, fresh4.generated_ids);
        (t1, t2, p2)
    };
    // one fresh prefill of the whole conversation
    let fresh = generate(model, &p2, &params, &mut |_| Ok(())).unwrap();
    assert_eq!(fresh.generated_ids, t2.generated_ids);
    assert!(!t1.generated_ids.is_empty());

    // the logits after a split prefill equal those of one prefill
    let k = p1.len() + 3;
    model.reset();
    model.forward(&p2[..k]).unwrap();
    let split = model.forward(&p2[k..]).unwrap();
    model.reset();
    let whole = model.forward(&p2).unwrap();
    let e = rel_err(&split, &whole);
    assert!(
        e < 1e-5,
        "relative error {e} between split and whole prefill"
    );
}

/// With a repeat penalty over the whole sequence, a turn that reuses the held state penalises the
/// earlier turns' ids as a fresh prefill of the conversation does.
fn check_penalised_continuation(model: &mut dyn Forward, eos: &[u32]) {
    let (_, r) = tokenizer_and_renderer();
    let effort = Some(Effort::NONE);
    let user = |s: &str| r.message(&Message::new(Role::User, s)).unwrap();
    let mut params = greedy(eos.to_vec(), 12);
    params.sampling.repeat_penalty = 1.5;
    params.sampling.repeat_last_n = WHOLE_SEQUENCE;
    let mut p1 = r.render(&[], effort).unwrap();
    p1.extend(user("the fox ran and the fox ran"));
    p1.extend(r.generation_prompt(effort));
    let mut s = Session::new(model);
    let t1 = s.generate(&p1, &params, &mut |_| Ok(())).unwrap();
    let p2 = next_turn(&r, &p1, &t1.generated_ids, "the fox ran");
    let t2 = s.generate(&p2, &params, &mut |_| Ok(())).unwrap();
    assert!(t2.reused > p1.len(), "reused {}", t2.reused);
    let fresh = generate(s.model(), &p2, &params, &mut |_| Ok(())).unwrap();
    assert_eq!(t2.generated_ids, fresh.generated_ids);
}

#[test]
fn kv_continuation_equals_fresh_prefill_cpu_and_gpu() {
    let ck = Checkpoint::open(&chat_model()).unwrap();
    let w = Weights::load(&ck).unwrap();
    let (_, r) = tokenizer_and_renderer();
    let eos = stop_ids(&ck, &r);
    check_continuation(&mut CpuModel::new(&w), &eos);
    check_penalised_continuation(&mut CpuModel::new(&w), &eos);
    let gpu = Gpu::new().expect("a GPU adapter (lavapipe: WGPU_BACKEND=vulkan)");
    let mut g = GpuModel::new(&gpu, &w, GpuModelOptions::new(512)).unwrap();
    check_continuation(&mut g, &eos);
    check_penalised_continuation(&mut g, &eos);
}
