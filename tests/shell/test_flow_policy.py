"""The built-in ``flow_policy``: a flow-matching action policy under OpenPI's contract.

Properties first: the chain a rollout records has OpenPI's fields and shapes; its
log-probabilities recompute bitwise from ``forward_inputs`` before any update; the steps
not drawn stochastic are the ODE's Euler steps and the drawn ones are the Gaussians their
log-probabilities say; eval is deterministic. Then learning signals (a PPO-style step
raises the log-likelihood of an advantaged chain; the flow-matching SFT loss clones a
demonstrated map) and the errors. Last, the vision-language encoder: the same contract
over images, task text and states, each of which changes the context; FSDP units; SFT
that fits a small (image, text) → action set; its errors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.fsdp import FSDPModule
from torch.distributions import Normal

from rlcore.distributions import flow_euler_step, flow_sde_step
from rlshell.config import ActorConfig, FSDPConfig, ModelConfig, WrapPolicyConfig
from rlshell.engines.training.fsdp import FSDPModelManager, wrap_units
from rlshell.envs.text import encode_texts
from rlshell.models import ForwardType, get_model
from rlshell.models.base import MissingInputError
from rlshell.models.flow_policy import FlowPolicy, build_flow_policy
from rlshell.models.vision_language import VisionLanguageEncoder

METHODS = (
    {"noise_method": "flow_sde"},
    {"noise_method": "flow_sde", "joint_logprob": True},
    {"noise_method": "flow_noise"},
)


def make_policy(obs_dim: int = 4, action_dim: int = 2, **extra: Any) -> FlowPolicy:
    kwargs = {"obs_dim": obs_dim, "action_dim": action_dim, "hidden_sizes": "32,32", **extra}
    return build_flow_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


@settings(deadline=None, max_examples=30)
@given(
    method=st.sampled_from(METHODS),
    batch=st.integers(1, 12),
    chunk=st.integers(1, 4),
    steps=st.integers(1, 6),
    normalize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_recorded_chain_recomputes_its_logprobs_bitwise(
    method: dict[str, Any], batch: int, chunk: int, steps: int, normalize: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    policy = make_policy(action_chunk=chunk, num_steps=steps, normalize_obs=normalize, **method)
    actions, info = policy.predict_action_batch({"states": torch.randn(batch, 4)})
    inputs = info["forward_inputs"]
    assert set(inputs) == {"states", "chains", "denoise_inds", "model_action", "action"}
    assert inputs["chains"].shape == (batch, steps + 1, chunk, 2)
    stochastic = steps if method != METHODS[0] else 1
    assert inputs["denoise_inds"].shape == (batch, stochastic)
    assert inputs["denoise_inds"].dtype == torch.int64
    assert torch.equal(inputs["model_action"], inputs["chains"][:, -1])
    assert actions.shape == ((batch, 2) if chunk == 1 else (batch, chunk, 2))
    out = policy.default_forward(inputs)
    assert torch.equal(out["logprobs"], info["prev_logprobs"])  # bitwise, in fp32
    assert torch.equal(out["values"], info["prev_values"])
    assert out["entropy"].shape == (batch,)


@pytest.mark.parametrize("method", METHODS, ids=["sde", "sde-joint", "noise"])
def test_each_step_is_euler_or_the_gaussian_its_logprob_scores(method: dict[str, Any]) -> None:
    torch.manual_seed(0)
    policy = make_policy(action_chunk=3, num_steps=4, **method)
    _, info = policy.predict_action_batch({"states": torch.randn(16, 4)})
    chains, inds = info["forward_inputs"]["chains"], info["forward_inputs"]["denoise_inds"]
    context = policy.encoder(info["forward_inputs"]["states"])
    delta = torch.full((16,), 0.25)
    total = torch.zeros(16)
    with torch.no_grad():
        for k in range(4):
            t = torch.full((16,), 1.0 - k / 4)
            velocity, hidden = policy._velocity(chains[:, k], t, context)
            euler = flow_euler_step(chains[:, k], velocity, delta)
            drawn = (inds == k).any(-1)
            torch.testing.assert_close(chains[~drawn, k + 1], euler[~drawn], rtol=0, atol=0)
            if method["noise_method"] == "flow_sde":
                mean, log_std = flow_sde_step(chains[:, k], velocity, t, delta, 0.5)
                std = log_std.exp()[:, None, None].expand_as(mean)
            else:
                low, high = 0.08, 0.16
                mean = euler
                std = low + (high - low) * torch.sigmoid(policy.noise_head(hidden)).view_as(mean)
            step = Normal(mean, std).log_prob(chains[:, k + 1]).sum((-2, -1))
            total += torch.where(drawn, step, 0.0)
    torch.testing.assert_close(info["prev_logprobs"], total)


def test_eval_runs_the_ode_from_the_noise_mode_and_is_deterministic() -> None:
    torch.manual_seed(0)
    policy = make_policy(action_low=-0.05, action_high=0.05)
    states = {"states": torch.randn(6, 4)}
    first, info = policy.predict_action_batch(states, mode="eval")
    second, _ = policy.predict_action_batch(states, mode="eval")
    assert torch.equal(first, second)
    assert torch.equal(info["forward_inputs"]["chains"][:, 0], torch.zeros(6, 1, 2))
    assert info["forward_inputs"]["denoise_inds"].shape == (6, 0)
    assert torch.equal(info["prev_logprobs"], torch.zeros(6))
    # The env gets the model action clipped to its bounds; the chain keeps it as it was.
    model_action = info["forward_inputs"]["model_action"][:, 0]
    assert torch.equal(first, model_action.clamp(-0.05, 0.05))


@pytest.mark.parametrize("method", METHODS, ids=["sde", "sde-joint", "noise"])
def test_a_policy_gradient_step_makes_an_advantaged_chain_more_likely(
    method: dict[str, Any],
) -> None:
    torch.manual_seed(1)
    policy = make_policy(**method)
    _, info = policy.predict_action_batch({"states": torch.randn(32, 4)})
    inputs = info["forward_inputs"]
    advantages = torch.where(torch.arange(32) % 2 == 0, 1.0, -1.0)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3)
    before = policy.default_forward(inputs)["logprobs"]
    (-(advantages * before).mean()).backward()
    optimizer.step()
    with torch.no_grad():
        change = policy.default_forward(inputs)["logprobs"] - before.detach()
    assert float((advantages * change).mean()) > 0


def test_sft_forward_clones_a_demonstrated_map() -> None:
    # Demonstrations a = W s (a chunk of 2 steps): flow matching should reproduce them.
    torch.manual_seed(0)
    policy = make_policy(obs_dim=3, action_chunk=2, num_steps=8, hidden_sizes="64,64")
    weights = torch.randn(3, 4) * 0.5
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(400):
        states = torch.randn(64, 3)
        loss = policy.sft_forward(states=states, actions=(states @ weights).view(64, 2, 2))["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    states = torch.randn(256, 3)
    acted, _ = policy.predict_action_batch({"states": states}, mode="eval")
    error = (acted - (states @ weights).view(256, 2, 2)).abs().mean()
    spread = (states @ weights).abs().mean()
    assert float(error) < 0.2 * float(spread), (float(error), float(spread))


def test_sft_in_train_mode_learns_the_demonstrations_state_statistics() -> None:
    # The states RL later shows the policy are normalised by what cloning saw, not by the
    # untouched initial statistics (a cloned policy otherwise acts on rescaled inputs).
    policy = make_policy(obs_dim=3, normalize_obs=True)
    states = torch.randn(500, 3) * 4.0 + 10.0
    policy.eval()
    policy.sft_forward(states=states, actions=torch.zeros(500, 2))
    assert float(policy.obs_count) == 0.0  # evaluation of a loss learns nothing
    policy.train()
    policy.sft_forward(states=states, actions=torch.zeros(500, 2))
    assert float(policy.obs_count) == 500.0
    torch.testing.assert_close(policy.obs_mean, states.double().mean(0))


def test_get_model_builds_the_registered_type() -> None:
    cfg = ModelConfig(
        model_type="flow_policy",
        category="embodied",
        precision="bf16",
        model_kwargs={"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise"},
    )
    policy = get_model(cfg)
    assert isinstance(policy, FlowPolicy)
    assert policy.velocity_out.weight.dtype == torch.bfloat16
    _, info = policy.predict_action_batch({"states": torch.randn(2, 3)})
    assert info["prev_logprobs"].dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action_dim": 2}, "obs_dim: missing"),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_level": 0.3},
            "noise_level",
        ),
        ({"obs_dim": 3, "action_dim": 2, "noise_std_range": "0.1,0.2"}, "noise_std_range"),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_std_range": "2"},
            "expected 'low,high'",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_std_range": "2,1"},
            "0 < low <= high",
        ),
        ({"obs_dim": 3, "action_dim": 2, "time_embed_dim": 7}, "must be even"),
        ({"obs_dim": 3, "action_dim": 2, "noise_method": "ddpm"}, "noise_method"),
        ({"obs_dim": 3, "action_dim": 2, "num_step": 4}, "did you mean 'num_steps'"),
    ],
)
def test_builder_errors_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_flow_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


def test_a_chain_of_another_shape_or_a_bad_step_index_is_refused() -> None:
    policy = make_policy(num_steps=3)
    _, info = policy.predict_action_batch({"states": torch.randn(2, 4)})
    inputs = dict(info["forward_inputs"])
    with pytest.raises(ValueError, match=r"\[batch, 4, 1, 2\]"):
        policy.default_forward({**inputs, "chains": inputs["chains"][:, :3]})
    with pytest.raises(ValueError, match=r"steps 0..2, got values in \[3, 3\]"):
        policy.default_forward({**inputs, "denoise_inds": torch.full((2, 1), 3)})
    with pytest.raises(KeyError, match="chains"):
        policy.default_forward({"states": inputs["states"]})


# ---------------------------------------------------------------------------
# The vision-language encoder.

SMALL_VL: dict[str, Any] = {
    "encoder": "vision_language",
    "image_size": 16,
    "patch_size": 4,
    "vision_width": 16,
    "vision_layers": 1,
    "text_length": 24,
    "context_width": 32,
    "context_layers": 2,
    "context_heads": 4,
    "hidden_sizes": "32,32",
}
TASKS = ("pick up the red cube", "open the drawer", "push the cube left")


def make_vl_policy(action_dim: int = 2, **extra: Any) -> FlowPolicy:
    kwargs = {**SMALL_VL, "action_dim": action_dim, **extra}
    return build_flow_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


def vl_encoder(policy: FlowPolicy) -> VisionLanguageEncoder:
    assert isinstance(policy.encoder, VisionLanguageEncoder)
    return policy.encoder


def vl_obs(
    batch: int, obs_dim: int = 0, wrist: bool = False, seed: int = 0, width: int = 32
) -> dict[str, Any]:
    """Random images, tasks drawn from TASKS as code points ``width`` wide, states."""
    generator = torch.Generator().manual_seed(seed)

    def images() -> torch.Tensor:
        return torch.randint(0, 256, (batch, 16, 16, 3), dtype=torch.uint8, generator=generator)

    picks = torch.randint(0, len(TASKS), (batch,), generator=generator).tolist()
    obs: dict[str, Any] = {
        "main_images": images(),
        "task_descriptions": encode_texts([TASKS[i] for i in picks], width),
    }
    if wrist:
        obs["wrist_images"] = images()
    if obs_dim:
        obs["states"] = torch.randn(batch, obs_dim, generator=generator)
    return obs


@pytest.mark.parametrize("method", METHODS, ids=["sde", "sde-joint", "noise"])
@pytest.mark.parametrize(
    ("obs_dim", "wrist", "normalize"),
    [(0, False, False), (5, True, True)],
    ids=["image+text", "two-cameras+states"],
)
def test_a_vision_language_chain_recomputes_its_logprobs_bitwise(
    method: dict[str, Any], obs_dim: int, wrist: bool, normalize: bool
) -> None:
    # As the actor runs them: the rollout in eval() under no_grad, the update in train().
    torch.manual_seed(0)
    policy = make_vl_policy(
        action_chunk=3,
        num_steps=4,
        obs_dim=obs_dim,
        wrist_images=wrist,
        normalize_obs=normalize,
        **method,
    )
    policy.eval()
    actions, info = policy.predict_action_batch(vl_obs(6, obs_dim, wrist))
    inputs = info["forward_inputs"]
    observed = {"main_images", "task_descriptions"} | ({"wrist_images"} if wrist else set())
    observed |= {"states"} if obs_dim else set()
    assert set(inputs) == observed | {"chains", "denoise_inds", "model_action", "action"}
    assert inputs["main_images"].dtype == torch.uint8
    # Code points past text_length (all padding here) are dropped, the rest kept as given.
    assert inputs["task_descriptions"].shape == (6, 24)
    assert inputs["chains"].shape == (6, 5, 3, 2)
    assert actions.shape == (6, 3, 2)
    policy.train()
    out = policy.default_forward(inputs)
    assert torch.equal(out["logprobs"], info["prev_logprobs"])  # bitwise, in fp32
    assert torch.equal(out["values"], info["prev_values"])
    assert out["entropy"].shape == (6,)


def test_vision_language_eval_is_deterministic_and_reads_strings_as_code_points() -> None:
    torch.manual_seed(0)
    policy = make_vl_policy(obs_dim=3)
    obs = vl_obs(5, obs_dim=3)
    first, info = policy.predict_action_batch(obs, mode="eval")
    second, _ = policy.predict_action_batch(obs, mode="eval")
    assert torch.equal(first, second)
    assert torch.equal(info["forward_inputs"]["chains"][:, 0], torch.zeros(5, 1, 2))
    # RLinf's env wrappers hand over strings: the same actions, the codes stored text_length wide.
    strings = [text.rstrip("\0") for text in map(_decode, obs["task_descriptions"])]
    third, info = policy.predict_action_batch({**obs, "task_descriptions": strings}, mode="eval")
    assert torch.equal(first, third)
    assert info["forward_inputs"]["task_descriptions"].shape == (5, 24)


def _decode(row: torch.Tensor) -> str:
    return "".join(chr(code) for code in row.tolist() if code)


def test_images_and_text_each_change_the_context_and_the_actions() -> None:
    torch.manual_seed(0)
    policy = make_vl_policy(wrist_images=True)
    obs = vl_obs(4, wrist=True)
    obs["task_descriptions"] = encode_texts([TASKS[0]] * 4, 24)
    base, _ = policy.predict_action_batch(obs, mode="eval")
    changes = {
        "main_images": 255 - obs["main_images"],
        "wrist_images": 255 - obs["wrist_images"],
        "task_descriptions": encode_texts([TASKS[1]] * 4, 24),
    }
    context = policy._context(policy._observation(obs, "env_obs"))
    for key, value in changes.items():
        changed = {**obs, key: value}
        other = policy._context(policy._observation(changed, "env_obs"))
        assert (other - context).abs().min() > 0, key
        acted, _ = policy.predict_action_batch(changed, mode="eval")
        assert (acted - base).abs().amin(-1).min() > 0, key


def test_an_unknown_character_is_unk_and_padding_is_masked() -> None:
    # Padding is masked out of attention: more zero columns leave the context as it was.
    torch.manual_seed(0)
    policy = make_vl_policy(text_length=40)
    obs = vl_obs(3, width=24)
    wider = {
        **obs,
        "task_descriptions": torch.cat(
            [obs["task_descriptions"], torch.zeros(3, 16, dtype=torch.int32)], dim=1
        ),
    }
    context = policy._context(policy._observation(obs, "env_obs"))
    padded = policy._context(policy._observation(wider, "env_obs"))
    torch.testing.assert_close(padded, context, rtol=0, atol=1e-6)
    encoder = vl_encoder(policy)
    ids = encoder.token_ids(encode_texts(["a\u00e9", ""], 3))
    assert ids.tolist() == [[encoder.char_ids[ord("a")].item(), 3, 0], [0, 0, 0]]


def test_the_wrap_policy_finds_the_encoder_units_by_name_and_by_default() -> None:
    policy = make_vl_policy()
    encoder = vl_encoder(policy)
    expected = [encoder.vision_tower, encoder.projector, *encoder.blocks]
    names = ("vision_tower", "projector", "context_block")
    for wrap in (WrapPolicyConfig(no_split_names=names), WrapPolicyConfig()):
        assert sorted(map(id, wrap_units(policy, wrap))) == sorted(map(id, expected))
    assert wrap_units(make_policy(), WrapPolicyConfig()) == []  # the state MLP: one unit


def test_the_fsdp_manager_shards_the_encoder_and_trains_after_a_rollout(
    process_group: None,
) -> None:
    kwargs = {**SMALL_VL, "action_dim": 2, "obs_dim": 3}
    actor = ActorConfig(
        model=ModelConfig(model_type="flow_policy", category="embodied", model_kwargs=kwargs),
        fsdp_config=FSDPConfig(mixed_precision="bf16", wrap_policy=WrapPolicyConfig()),
    )
    manager = FSDPModelManager(actor, total_steps=2, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    model = manager.module
    sharded = {name for name, module in model.named_modules() if isinstance(module, FSDPModule)}
    assert sharded == {
        "",
        "encoder.vision_tower",
        "encoder.projector",
        "encoder.blocks.0",
        "encoder.blocks.1",
    }
    with manager.unsharded() as policy:
        assert isinstance(policy, FlowPolicy)
        policy.eval()
        _, info = policy.predict_action_batch(vl_obs(4, obs_dim=3))
    model.train()
    out = model(ForwardType.DEFAULT, forward_inputs=info["forward_inputs"])
    # The update computes in bf16 (one fp32 rank would not be sharded), the rollout did not.
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"], rtol=0, atol=0.05)
    (-(out["logprobs"].mean()) + out["values"].square().mean()).backward()
    grad_norm, _ = manager.optimizer_step()
    assert grad_norm > 0


def test_sft_fits_a_small_image_and_text_to_action_set() -> None:
    # Four (image, task) pairs: the action needs both (a = colour term + task term).
    torch.manual_seed(0)
    policy = make_vl_policy(action_chunk=2, num_steps=8)
    colours = torch.tensor([[220, 30, 30], [30, 30, 220]], dtype=torch.uint8)
    images = colours[:, None, None, :].expand(2, 16, 16, 3)
    texts = encode_texts(TASKS[:2], 24)
    pairs = [(i, j) for i in range(2) for j in range(2)]
    main_images = torch.stack([images[i] for i, _ in pairs])
    task_descriptions = torch.stack([texts[j] for _, j in pairs])
    colour_term = torch.tensor([[0.6, -0.4], [-0.6, 0.4]])
    task_term = torch.tensor([[0.3, 0.3], [-0.3, 0.0]])
    targets = torch.stack([colour_term[i] + task_term[j] for i, j in pairs])
    targets = torch.stack([targets, -targets], dim=1)  # [4, chunk 2, dim 2]
    batch = {
        "main_images": main_images.repeat(4, 1, 1, 1),
        "task_descriptions": task_descriptions.repeat(4, 1),
        "actions": targets.repeat(4, 1, 1),
    }
    optimizer = torch.optim.Adam(policy.parameters(), lr=5e-3)
    losses = []
    for _ in range(150):
        loss = policy(ForwardType.SFT, **batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) < 0.25 * sum(losses[:10]), (losses[:3], losses[-3:])
    obs = {"main_images": main_images, "task_descriptions": task_descriptions}
    acted, _ = policy.predict_action_batch(obs, mode="eval")
    error = (acted - targets).abs().mean()
    assert float(error) < 0.2 * float(targets.abs().mean()), float(error)
    # Each pair acts nearest its own target: neither the image nor the text was ignored.
    nearest = torch.cdist(acted.flatten(1), targets.flatten(1)).argmin(1)
    assert nearest.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"encoder": "vlm"}, r"encoder: got 'vlm'.*expected one of 'state', 'vision_language'"),
        ({"encoder": "state", "obs_dim": 3, "image_size": 32}, "not read with encoder 'state'"),
        ({"patch_size": 5}, "patch_size: 5 does not divide image_size 16"),
        ({"context_heads": 5}, "context_heads: 5 heads do not divide context_width 32"),
        ({"normalize_obs": True}, "normalize_obs: normalises states, but obs_dim is 0"),
        ({"alphabet": "abca"}, r"alphabet: list each character once.*\['a'\]"),
        ({"text_lenght": 8}, "did you mean 'text_length'"),
    ],
)
def test_vision_language_builder_errors_name_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_vl_policy(**extra)


def test_vision_language_inputs_of_the_wrong_shape_are_refused_clearly() -> None:
    policy = make_vl_policy(obs_dim=3)
    obs = vl_obs(2, obs_dim=3)
    with pytest.raises(
        ValueError, match=r"env_obs\['main_images'\] must be uint8 \[batch, 16, 16, 3\]"
    ):
        policy.predict_action_batch(
            {**obs, "main_images": torch.zeros(2, 32, 32, 3, dtype=torch.uint8)}
        )
    with pytest.raises(ValueError, match=r"must be uint8 .* got torch.float32"):
        policy.predict_action_batch({**obs, "main_images": obs["main_images"].float()})
    with pytest.raises(ValueError, match=r"longer than actor.model.model_kwargs.text_length \(24"):
        policy.predict_action_batch({**obs, "task_descriptions": encode_texts(["x" * 30] * 2, 32)})
    with pytest.raises(
        ValueError, match=r"states'\] must be \[batch, 3\] \(obs_dim\), got \(2, 4\)"
    ):
        policy.predict_action_batch({**obs, "states": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="disagree on the batch size"):
        policy.predict_action_batch({**obs, "states": torch.zeros(3, 3)})
    with pytest.raises(MissingInputError, match="task_descriptions"):
        policy.sft_forward(actions=torch.zeros(2, 2), main_images=obs["main_images"])


def test_get_model_builds_the_vision_language_policy_in_bf16() -> None:
    cfg = ModelConfig(
        model_type="flow_policy",
        category="embodied",
        precision="bf16",
        model_kwargs={**SMALL_VL, "action_dim": 2, "obs_dim": 3, "noise_method": "flow_noise"},
    )
    policy = get_model(cfg)
    assert isinstance(policy, FlowPolicy)
    assert vl_encoder(policy).summary.dtype == torch.bfloat16
    actions, info = policy.predict_action_batch(vl_obs(2, obs_dim=3))
    assert actions.dtype == info["prev_logprobs"].dtype == torch.float32
    assert torch.isfinite(info["prev_logprobs"]).all()


@pytest.mark.parametrize("detach", [False, True])
def test_a_detached_value_input_keeps_the_value_loss_out_of_the_encoder(detach: bool) -> None:
    """``detach_value_input``: the value head learns on the encoder's features, and the value
    loss's gradient stops there, so only the policy's loss moves a cloned encoder."""
    torch.manual_seed(0)
    policy = make_vl_policy(obs_dim=3, detach_value_input=detach)
    _, info = policy.predict_action_batch(vl_obs(4, obs_dim=3))
    out = policy.default_forward(info["forward_inputs"])
    out["values"].square().mean().backward()
    encoder_grads = [p.grad for p in vl_encoder(policy).parameters() if p.grad is not None]
    head_grads = [p.grad for p in policy.value_head.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in head_grads)
    assert bool(encoder_grads) is not detach
    assert torch.equal(out["values"], info["prev_values"])  # the values themselves unchanged
