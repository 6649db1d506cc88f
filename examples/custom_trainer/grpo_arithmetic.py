"""GRPO from scratch on sums of small numbers: a custom trainer built on rlcore, in one process.

No Ray and no rlshell runner: the maths (advantages, log-probs, the clipped
loss, rollout masks) comes from `rlcore`, the tokenizer, the task and the
reward from `rlshell`, the model and `generate` from transformers. The loop
is the whole algorithm:

    sample G responses per prompt → score them → group-normalise the scores
    → clipped policy-gradient step on the response tokens

The task: ``"4+6+8="`` → ``"18"``, three digits summed, 1000 distinct
prompts of which 200 are held out and never trained on. A randomly
initialised 75k-parameter model samples a right answer about 0.7% of the time
and answers none of the held-out prompts greedily; on one CPU core GRPO takes
its greedy held-out accuracy to 0.700 in 2000 steps (86 s of CPU, measured in
docs/benchmarks.md).
The best constant answer would score 8%. A learning rate of 1e-3 instead
collapses the policy onto one answer within a few hundred steps.

    python examples/custom_trainer/grpo_arithmetic.py --steps 2000
"""

from __future__ import annotations

import argparse
import functools
import logging
import tempfile
import time

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

import rlcore
from rlshell.data import ArithmeticTask, PromptExample, PromptSampler, arithmetic_task
from rlshell.rewards.rule_based import math_reward
from rlshell.tokenizer import ensure_tokenizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=2000, help="policy updates")
    add("--lr", type=float, default=3e-4, help="AdamW learning rate (1e-3 collapses entropy)")
    add("--seed", type=int, default=0)
    add("--group-size", type=int, default=8, help="responses per prompt (G)")
    add("--prompts-per-step", type=int, default=16)
    # Shorter than a prompt's sum: math-verify scores a copied "4+6+8" as 18.
    add("--max-new-tokens", type=int, default=4, help="response length limit")
    add("--temperature", type=float, default=1.0)
    add("--clip", type=float, default=0.2, help="PPO clip ε")
    add("--num-terms", type=int, default=3, help="numbers summed per prompt")
    add("--max-operand", type=int, default=9, help="numbers lie in [0, max-operand]")
    add("--num-val", type=int, default=200, help="held-out prompts")
    add("--hidden-size", type=int, default=64)
    add("--layers", type=int, default=2)
    add("--heads", type=int, default=4)
    add("--eval-every", type=int, default=100)
    add("--threads", type=int, default=1, help="torch threads (one per free core)")
    add("--tokenizer-dir", default=None, help="where the tokenizer is saved (default: a temp dir)")
    return parser.parse_args()


def build_model(tokenizer, args: argparse.Namespace) -> Qwen2ForCausalLM:
    """A tiny Qwen2-style decoder over the tokenizer's vocabulary, randomly initialised."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=2 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads // 2 or 1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], config: GenerationConfig):
    """Left-padded prompts → (full sequences, prompt attention mask, response tokens)."""
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    sequences = model.generate(**encoded, generation_config=config)
    prompt_length = encoded["input_ids"].shape[1]
    return sequences, encoded["attention_mask"], sequences[:, prompt_length:]


def response_logprobs(model, sequences, prompt_mask, responses, eos_id: int):
    """log π(yₜ) of each response token, the response mask, and the token entropies.

    With left padding a prompt's first real token sits after the padding, so
    the positions are counted over the attention mask, as `generate` counted
    them. The response mask keeps every token up to and including the first
    EOS; `generate` pads after it.
    """
    mask = rlcore.tokens.response_mask(responses, eos_id)
    attention = torch.cat([prompt_mask.bool(), mask], dim=1)
    logits = model(
        input_ids=sequences,
        attention_mask=attention.long(),
        position_ids=rlcore.tokens.position_ids(attention),
    ).logits
    # The logits at position t predict the token at t + 1.
    response_logits = logits[:, prompt_mask.shape[1] - 1 : -1]
    stats = rlcore.logprobs.token_stats(response_logits, responses)
    return stats.logprobs, mask, stats.entropy


# Short responses repeat often, and math-verify's parsing is the slowest part of a step.
cached_math_reward = functools.lru_cache(maxsize=1 << 16)(math_reward)


def score(tokenizer, responses, examples: list[PromptExample], group_size: int) -> torch.Tensor:
    """math-verify's verdict on each response, ``[prompts, group_size]``."""
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    answers = [example.answer for example in examples for _ in range(group_size)]
    rewards = [cached_math_reward(t, a) for t, a in zip(texts, answers, strict=True)]
    return torch.tensor(rewards).view(len(examples), group_size)


def accuracy(model, tokenizer, examples: list[PromptExample], max_new_tokens: int) -> float:
    """Greedy accuracy: the fraction of prompts whose most likely response is right."""
    greedy = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    _, _, responses = generate(model, tokenizer, [e.prompt for e in examples], greedy)
    return score(tokenizer, responses, examples, group_size=1).mean().item()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # math-verify warns on every call that its timeouts are off (rlshell bounds them itself).
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    tokenizer = ensure_tokenizer(args.tokenizer_dir or tempfile.mkdtemp(prefix="tokenizer-"))
    task = ArithmeticTask(
        num_terms=args.num_terms, max_operand=args.max_operand, num_val=args.num_val
    )
    train, held_out = arithmetic_task("train", task), arithmetic_task("val", task)
    prompts = PromptSampler(train, batch_size=args.prompts_per_step, seed=args.seed)
    model = build_model(tokenizer, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sampling = GenerationConfig(
        do_sample=True,
        temperature=args.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"{parameters:,} parameters, vocabulary {len(tokenizer)}, "
        f"{len(train)} train / {len(held_out)} held-out prompts, e.g. "
        f"{held_out[0].prompt!r} → {held_out[0].answer!r}"
    )

    start, start_cpu = time.perf_counter(), time.process_time()
    val_accuracy = accuracy(model, tokenizer, held_out, args.max_new_tokens)
    print(f"step 0 held-out accuracy {val_accuracy:.3f}")
    for step in range(1, args.steps + 1):
        batch = prompts.next()
        model.eval()
        group_prompts = [example.prompt for example in batch for _ in range(args.group_size)]
        sequences, prompt_mask, responses = generate(model, tokenizer, group_prompts, sampling)
        scores = score(tokenizer, responses, batch, args.group_size)
        advantages = rlcore.advantages.group_normalized(scores).flatten()

        model.train()
        logprobs, mask, entropy = response_logprobs(
            model, sequences, prompt_mask, responses, tokenizer.eos_token_id
        )
        # One update per batch: π_old is the policy that just sampled it, so the
        # ratio starts at 1 (more epochs over a batch would need these saved first).
        loss = rlcore.losses.ppo_policy_loss(
            logprobs,
            logprobs.detach(),
            rlcore.tokens.broadcast_to_tokens(advantages, mask),
            mask,
            clip_low=args.clip,
        ).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

        line = (
            f"step {step:4d}  reward {scores.mean().item():.3f}  "
            f"entropy {rlcore.masked.masked_mean(entropy, mask).item():.3f}"
        )
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            val_accuracy = accuracy(model, tokenizer, held_out, args.max_new_tokens)
            line += f"  held-out accuracy {val_accuracy:.3f}"
        # Wall time, and this process's CPU time (what counts on a shared machine).
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        print(f"{line}  {wall:6.1f}s (cpu {cpu:6.1f}s)", flush=True)


if __name__ == "__main__":
    main()
