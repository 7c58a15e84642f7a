"""How long one training step takes: compute, communication, and how much of it overlaps.

**Compute** (the FLOP convention, ``docs/flops.md``). Per token, a step executes:

- 2 FLOPs per parameter that a matrix multiplies in the forward pass and 4 in the backward
  (Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1: C = 6N per token, N without the
  embeddings). The input embedding (and a learned position embedding) is a lookup, a gather of
  one row per token, not a matrix product: its parameters cost no FLOPs
  (:func:`zerolib.core.step.flops.idle_parameters`; ``idle_parameters``). The output
  projection is a matrix product and counts, tied to the embedding or not. A mixture of
  experts' routed experts that a token skips cost nothing either: its FLOPs are the active
  parameters'.
- The attention core, Q K^T and the attention over V: 2 s (a d_qk) + 2 s (a d_v) forward FLOPs
  per token and layer over s tokens with a heads of widths d_qk and d_v
  (:func:`attention_core_flops`; 4 s h for a plain model, Narayanan et al.'s 4Bs^2h per
  layer), twice that in the backward (the gradients of both inputs of each product). A causal
  kernel that skips the masked blocks (flash attention's, and the fused kernels of
  TransformerEngine) computes half of the s x s products: with ``flash_attention`` the core is
  counted causal, s (a d_qk + a d_v) per token and layer; Megatron-LM's unfused core attention
  computes the whole s x s matrix, masked after, and is counted so. Every step pays it
  (Narayanan et al. 2021, arXiv:2104.04473, Eq. 3; Chowdhery et al. 2022, PaLM, App. B).
  The softmax and dropout are element-wise and left out.

What recomputation repeats follows the run's one recompute setting (the working set's
``recompute``, :data:`zerolib.core.memory.activations.RECOMPUTE`), never a flag of its own:

- ``none``: the above;
- ``full``: the forward again inside the backward, 2 more per parameter and token (Narayanan et
  al. 2021, appendix: 96Bslh^2 = 4 x 24Bslh^2 with recomputation) and the attention core's
  forward once more;
- ``selective``: the attention core's forward once more (Korthikanti et al., MLSys 2023,
  arXiv:2205.05198, Sec. 5: the Q K^T product, softmax, softmax dropout and attention over V).

So per token the step executes 6 M + 3 A without recomputation, 6 M + 4 A selective and
8 M + 4 A full, M the multiplied parameters and A the core's forward FLOPs. A bare parameter
count has no shape: every parameter is multiplied and its core is 0 (6 or 8 per parameter
and token). The core is counted over the model's whole span (sliding windows are not
modelled), and flash attention's backward, which recomputes the scores inside the kernel, is
charged only its two products (the publishers count it so; what the kernel spends beyond them
is in the utilisation).

A GPU reaches a fraction ``mfu`` of its
peak (:mod:`zerolib.core.catalogue.devices`) on the FLOPs it executes: without recomputation this is the
model FLOPs utilisation of Chowdhery et al. 2022 (PaLM, Sec. 4.1); with recomputation the
GPU executes more FLOPs at that rate (Korthikanti et al., MLSys 2023, Sec. 6.3, call the rate
on executed FLOPs the hardware FLOPs utilisation). The default, 0.4, sits in the range large
runs publish: 38-43 % for Llama 3 405B on H100 (arXiv:2407.21783, Table 4), 46.2 % for PaLM
540B. The optimizer step's own compute is left out (it reads each parameter once, against the
thousands of FLOPs each parameter costs per sequence).

**Communication.** Each slot of the schedule (:data:`zerolib.core.step.traffic.GROUP_SLOTS`)
takes calls x ring latency + bytes sent / bus bandwidth, on the ring it uses. **One ring model**
times every collective of the package, data parallelism alone or beside tensor and pipeline
parallelism: a ring over ``size`` GPUs whose ranks are ``stride`` apart (ranks fill nodes in
order, :func:`zerolib.core.step.collectives.ring_timing`) with ``per_node`` of them on a node
stays inside one node when size x stride <= K GPUs per node and runs at the intra-node link's
rate; otherwise it leaves each node through the node's ports, shared by the K / per_node rings
that leave it at once: bus bandwidth min(intra-node rate, ports x port rate x per_node / K),
every rate the one NCCL reaches by default (the interconnect's ``LinkEfficiency``). A
shard group of G <= K GPUs sits in a node; the all-reduce across its replicas (ranks G apart)
shares the ports min(G, K) ways; with tensor parallelism t every data-parallel ring's ranks are t
times further apart. Latency is NCCL's base plus a hop per ring step, the network's for the
steps that cross nodes (:func:`zerolib.core.catalogue.nodes.spanning_latency`). With a single link
(no nodes) every ring runs on it alike. A point-to-point message (a pipeline's) pays the base
latency, one hop, and its bytes at the link's rate (across nodes, each GPU's share of its node's
ports). Collectives share one network and run one after another.

**Offload** adds each phase's host transfers (:mod:`zerolib.core.step.offload_traffic`) to that
phase's communication, after its collectives (the GPU's PCIe path also carries the network's
traffic on most servers): the gradient copies hide behind the backward pass, the parameter
fetches behind the pass that needs them, the after-step copies and NVMe reads and writes hide
behind nothing. With the optimizer offloaded, the CPU's optimizer step runs after the backward
and before the next forward, hidden behind nothing too (DeepSpeed's default ZeRO-Offload;
:mod:`zerolib.core.step.offload_traffic` gives its time and sources): it joins the after-step
part.

**Overlap** (a stated rule, :class:`zerolib.core.step.engines.Overlap`; by default the
traffic's engine's own, :mod:`zerolib.core.step.engines`). A collective can run while the GPU
computes something that does not need its result:

- the forward's all-gathers (stage 3; FSDP2's stage 2 too) overlap the forward compute when the
  rule says ``forward_hidden`` (each layer's gather is issued ahead of it, **prefetched**);
  with ``first_gather_exposed`` the first layer's gather of each micro-batch waits (nothing
  computes before it): DeepSpeed's and FSDP2's rules, not the paper's;
- the backward's collectives (gradient all-reduce or reduce-scatter, stage 3's backward
  gathers, the replicas' all-reduce, qgZ's all-to-alls) overlap the backward compute at the
  stages of ``backward_hidden``: every stage under the paper's rule and FSDP2's; under
  DeepSpeed's defaults stage 3 only (``overlap_comm`` is on for stage 3 alone, and stages 0-1
  reduce after the backward pass); under Megatron-LM's none unless ``--overlap-grad-reduce``;
- stages 1-2's all-gather of the updated parameters runs after the optimizer step and before
  the next forward: it overlaps nothing (DeepSpeed), unless ``post_step_gather_hidden`` (the
  Ultra-Scale Playbook's description, Megatron-LM's ``--overlap-param-gather``): then it joins
  the first micro-batch's forward;
- ``latency_exposed`` charges every call's ring latency to the step even where its bytes hide.

**Micro-batches** (m, the traffic's): a step computes m micro-batches of 1/m of the compute
each; what runs every micro-batch (stage 3's gathers, stages 2-3's reductions) hides behind each
micro-batch's pass, what runs once (stages 0-1's reduction at the last micro-batch, the
replicas' all-reduce, offload's copies) behind the last micro-batch's backward only
(:func:`exposed_seconds`). Step time = compute + exposed; the **network-wait fraction** is
exposed / step time. The last bucket's reduction, with no compute after it, is left out.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.links import BASE_LATENCY
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.catalogue.nodes import Interconnect, interconnect
from zerolib.core.defaults import (  # noqa: F401 (where callers find them)
    DEFAULT_MFU,
    DEFAULT_TOKENS_PER_GPU,
    MAX_TOKENS_PER_GPU,
    MIN_MFU,
)
from zerolib.core.inputs import (
    MAX_BYTES,
    check_count,
    check_gpus,
    check_mfu,  # noqa: F401 (where callers find it)
    check_positive_int,
    check_whole,
    echo,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.step.collectives import across_bandwidth, ring_timing_of
from zerolib.core.step.engines import Overlap
from zerolib.core.step.offload_traffic import (
    HostSettings,
    HostTraffic,
    check_host_settings,
)
from zerolib.core.step.traffic import GROUP_SLOTS, STEP_PHASES, Traffic

FORWARD_FLOPS = 2          # per multiplied parameter and token
BACKWARD_FLOPS = 4
RECOMPUTE_FLOPS = 2        # full recomputation: the forward again, inside the backward
ATTENTION_BACKWARD = 2     # the core's backward: twice its forward (both inputs' gradients)


def attention_core_flops(model: str | TransformerConfig, seq_len: int, tensor_parallel=1,
                         layers=None, *, causal: bool = False):
    """Forward FLOPs per token of the attention core on one GPU (see the module doc): per layer
    2 s (a d_qk) for the scores Q K^T and 2 s (a d_v) for the attention over V, ceil(a / t) of
    the a heads on each of ``tensor_parallel`` GPUs, over ``layers`` layers (default: all of the
    model's); ``causal``: half of that, the products a causal kernel computes. Multi-head
    latent attention (DeepSeek) scores over head_dim + rope_head_dim and attends over
    v_head_dim. An int, or an int64 array where ``tensor_parallel`` or ``layers`` is one."""
    config = get_model(model)
    s = check_positive_int(seq_len, "seq_len")
    t = check_gpus(tensor_parallel, "tensor_parallel")
    layers = (np.asarray(config.layers) if layers is None else
              check_whole(layers, "layers", "a whole number of layers", low=0, high=config.layers))
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {echo(causal)}")
    flops = attention_core_flops_of(config, s, t, layers, bool(causal))
    return int(flops) if flops.ndim == 0 else flops


def attention_core_flops_of(config: TransformerConfig, seq_len: int, t, layers,
                            causal: bool = False) -> np.ndarray:
    """:func:`attention_core_flops` of checked values (int64, broadcast over ``t`` and
    ``layers``), for callers below the door that checked them already."""
    if config.kv_lora_rank:
        qk, v = config.head_width + config.rope_head_dim, config.v_head_dim
    else:
        qk = v = config.head_width
    per_pair = 1 if causal else 2     # a causal kernel computes half of the s x s products
    return (per_pair * seq_len * ceil_div(config.heads, np.asarray(t, dtype=np.int64)) * (qk + v)
            * np.asarray(layers, dtype=np.int64))


def step_flops(multiplied, core, recompute: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) FLOPs per token of a GPU that multiplies ``multiplied`` parameters
    and runs ``core`` forward FLOPs of attention core per token (the module doc's rule):
    forward 2 M + A, backward 4 M + 2 A, plus 2 M + A under full recomputation and A under
    selective. float64, broadcast; ``recompute`` one name of RECOMPUTE."""
    m = np.asarray(multiplied, dtype=np.float64)
    a = np.asarray(core, dtype=np.float64)
    forward = FORWARD_FLOPS * m + a
    backward = BACKWARD_FLOPS * m + ATTENTION_BACKWARD * a
    if recompute == "full":
        backward = backward + RECOMPUTE_FLOPS * m + a
    elif recompute == "selective":
        backward = backward + a
    return forward, backward


@dataclass(frozen=True)
class ComputeSettings:
    """How much each GPU computes per step and how fast, and what its recomputation repeats."""

    tokens_per_gpu: int = DEFAULT_TOKENS_PER_GPU   # tokens one GPU processes per step
    mfu: float = DEFAULT_MFU                       # fraction of the device's peak reached
    recompute: str = "none"                        # the run's recompute setting (RECOMPUTE)
    attention_flops_per_token: int = 0             # attention_core_flops of this GPU (0: no shape)
    # Parameters no matrix multiplies: the input embedding's lookup, the experts a token skips.
    idle_parameters: int = 0

    def __post_init__(self):
        check_positive_int(self.tokens_per_gpu, "tokens_per_gpu", MAX_TOKENS_PER_GPU)
        object.__setattr__(self, "mfu", check_mfu(self.mfu))
        if not isinstance(self.recompute, str) or self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, "
                             f"got {echo(self.recompute)}")
        check_count(self.attention_flops_per_token, "attention_flops_per_token", MAX_BYTES)
        check_count(self.idle_parameters, "idle_parameters", MAX_BYTES)

    def __deepcopy__(self, memo) -> ComputeSettings:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @classmethod
    def from_checked(cls, tokens_per_gpu: int, mfu: float, recompute: str) -> ComputeSettings:
        """Settings a door checked already (the parallel step's, from its checked
        :class:`~zerolib.core.step.parallel.ParallelSettings`), made without checking them again."""
        settings = object.__new__(cls)
        for name, value in (("tokens_per_gpu", tokens_per_gpu), ("mfu", mfu),
                            ("recompute", recompute), ("attention_flops_per_token", 0),
                            ("idle_parameters", 0)):
            object.__setattr__(settings, name, value)
        return settings

    @classmethod
    def for_run(cls, model: str | TransformerConfig, settings, mfu: float = DEFAULT_MFU,
                tokens_per_gpu: int | None = None) -> ComputeSettings:
        """The compute of the run a :class:`~zerolib.core.memory.working_set.WorkingSetSettings`
        describes: its sequence length x micro-batch tokens per GPU (or ``tokens_per_gpu``), its
        recomputation, the attention core of ``model`` at its sequence length on one of its
        tensor-parallel GPUs (the first pipeline stage's layers, the most; causal with flash
        attention) and the parameters no matrix multiplies (the model's input embedding and the
        experts a token skips, on one GPU of the whole model: the data-parallel step's). The one
        way the step model reads the recompute setting beside a working set."""
        if not isinstance(settings, WorkingSetSettings):
            raise TypeError(f"settings must be a WorkingSetSettings, got {type(settings).__name__}")
        from zerolib.core.step.flops import idle_parameters  # (flops imports this module)
        config = get_model(model)
        layers = ceil_div(config.layers, settings.pipeline_parallel)
        tokens = settings.seq_len * settings.micro_batch if tokens_per_gpu is None else tokens_per_gpu
        return cls(tokens, mfu, settings.recompute,
                   attention_core_flops(config, settings.seq_len, settings.tensor_parallel, layers,
                                        causal=settings.flash_attention),
                   int(idle_parameters(config)))

    @property
    def full_recompute(self) -> bool:
        return self.recompute == "full"

    @property
    def flops_per_param_token(self) -> int:
        """The FLOPs per multiplied parameter and token: 6, or 8 under full recomputation."""
        return FORWARD_FLOPS + BACKWARD_FLOPS + (RECOMPUTE_FLOPS if self.full_recompute else 0)

    @property
    def recomputed_attention_flops(self) -> int:
        """FLOPs per token the backward spends recomputing the attention core (0 without
        recomputation)."""
        return 0 if self.recompute == "none" else self.attention_flops_per_token

    @property
    def attention_step_flops(self) -> int:
        """FLOPs per token of the attention core in the whole step: forward, backward (twice
        the forward) and what recomputation repeats."""
        return ((1 + ATTENTION_BACKWARD) * self.attention_flops_per_token
                + self.recomputed_attention_flops)

    def as_dict(self) -> dict:
        return {"tokens_per_gpu": self.tokens_per_gpu, "mfu": self.mfu,
                "recompute": self.recompute, "full_recompute": self.full_recompute,
                "flops_per_param_token": self.flops_per_param_token,
                "idle_parameters": self.idle_parameters,
                "attention_flops_per_token": self.attention_flops_per_token,
                "recomputed_attention_flops_per_token": self.recomputed_attention_flops,
                "attention_step_flops_per_token": self.attention_step_flops}


DEFAULT_COMPUTE = ComputeSettings()


def _rate(device: Device, settings: ComputeSettings) -> float:
    if not device.peak_flops:
        raise ValueError(f"device {device.name} has no peak FLOP/s in the catalogue")
    return device.peak_flops * settings.mfu


def compute_seconds(params, device: str | Device, settings: ComputeSettings = DEFAULT_COMPUTE):
    """(forward, backward) compute seconds of one step on one GPU (float64, broadcast over
    ``params``): :func:`step_flops` of the parameters a matrix multiplies (``params`` less the
    settings' ``idle_parameters``) and the attention core, x tokens / (peak x mfu) (see the
    module doc)."""
    device = get_device(device)
    if not isinstance(settings, ComputeSettings):
        raise TypeError(f"settings must be a ComputeSettings, got {type(settings).__name__}")
    rate = _rate(device, settings)
    multiplied = np.maximum(np.asarray(params, dtype=np.float64) - settings.idle_parameters, 0.0)
    forward, backward = step_flops(multiplied, settings.attention_flops_per_token,
                                   settings.recompute)
    per_second = settings.tokens_per_gpu / rate
    return forward * per_second, backward * per_second


# --- timing on the links: a schedule on its rings, a pipeline message -----------------------------

def send_seconds(ic: Interconnect, message_bytes, crosses_nodes) -> np.ndarray:
    """Seconds of one point-to-point message between pipeline stages: NCCL's base latency and
    one hop of the link it takes, plus the bytes at that link's rate at the interconnect's
    efficiency (across nodes: each GPU's share of its node's ports)."""
    message = np.asarray(message_bytes, dtype=np.float64)
    crosses = np.asarray(crosses_nodes, dtype=bool) & (ic.network is not None)
    inside = BASE_LATENCY + ic.intra.hop_latency + message / ic.intra_rate
    if ic.network is None:
        return np.broadcast_to(inside, np.broadcast(inside, crosses).shape).copy()
    across = (BASE_LATENCY + ic.network.hop_latency
              + message / across_bandwidth(ic, np.ones_like(message)))
    return np.where(crosses, across, inside)


def schedule_seconds(traffic: Traffic, ic: Interconnect, spacing=1, calls=None
                     ) -> tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]:
    """(seconds, bus bandwidth) of each slot of ``traffic`` on the ring it uses, its ranks
    ``spacing`` times further apart than the traffic's own (tensor parallelism's t), with
    ``calls`` per slot in place of the traffic's where given. A slot no setting uses costs 0."""
    seconds, bandwidth = {}, {}
    for slot in GROUP_SLOTS:
        name = slot.name
        count = traffic.calls[name] if calls is None else calls[name]
        # A Traffic's rings were checked when it was built: timed without checking them again.
        latency, bandwidth[name] = ring_timing_of(ic, slot.kind, traffic.ring_gpus[name],
                                                  traffic.ring_stride[name] * spacing)
        seconds[name] = (np.asarray(count, dtype=np.float64) * latency
                         + np.asarray(traffic.sent[name], dtype=np.float64) / bandwidth[name])
    return MappingProxyType(seconds), MappingProxyType(bandwidth)


# --- the step ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTime:
    """Seconds of one step per setting (float64 arrays broadcast like the traffic).

    ``compute`` and ``exposed`` are None when no device was given (no compute time).
    """

    slot_seconds: Mapping[str, np.ndarray] = field(repr=False)
    slot_bandwidth: Mapping[str, np.ndarray] = field(repr=False)
    host: Mapping[str, np.ndarray] = field(repr=False)                # per phase
    compute: Mapping[str, np.ndarray] | None = field(repr=False)      # forward, backward
    exposed: Mapping[str, np.ndarray] | None = field(repr=False)      # per phase of STEP_PHASES
    cpu_step: np.ndarray | None = field(default=None, repr=False)     # the CPU's optimizer step

    @property
    def cpu_step_seconds(self) -> np.ndarray:
        """The CPU's optimizer step (0 without an offloaded optimizer)."""
        return (np.zeros(np.shape(self.host_seconds)) if self.cpu_step is None
                else self.cpu_step)
    overlap: Overlap | None = None       # the rule the exposed time follows
    engine: str | None = None            # whose schedule was timed

    @property
    def communication_seconds(self) -> np.ndarray:
        """All collectives back to back (what the step would take without any overlap, minus
        the compute; host transfers not included)."""
        return sum(self.slot_seconds.values())

    @property
    def host_seconds(self) -> np.ndarray:
        """All host transfers of the step (PCIe copies and NVMe; the CPU's optimizer step is
        :attr:`cpu_step_seconds`)."""
        return sum(self.host.values())

    def kind_seconds(self, kind: str) -> np.ndarray:
        return sum(self.slot_seconds[s.name] for s in GROUP_SLOTS if s.kind == kind)

    def phase_communication(self, phase: str) -> np.ndarray:
        return sum(self.slot_seconds[s.name] for s in GROUP_SLOTS if s.phase == phase)

    @property
    def compute_seconds(self) -> np.ndarray | None:
        return None if self.compute is None else self.compute["forward"] + self.compute["backward"]

    @property
    def exposed_seconds(self) -> np.ndarray | None:
        return None if self.exposed is None else sum(self.exposed.values())

    @property
    def step_seconds(self) -> np.ndarray | None:
        return None if self.compute is None else self.compute_seconds + self.exposed_seconds

    @property
    def network_wait_fraction(self) -> np.ndarray | None:
        return None if self.compute is None else self.exposed_seconds / self.step_seconds


def _check_node(traffic: Traffic, ic: Interconnect) -> None:
    # A shard group's validity depends on where the nodes fall: the traffic's must be these.
    if traffic.grouped and ic.gpus_per_node not in (None, traffic.gpus_per_node):
        raise ValueError(f"the traffic was placed on nodes of {traffic.gpus_per_node} GPUs, the "
                         f"interconnect {ic.name} has {ic.gpus_per_node} per node: place the "
                         "traffic on the interconnect's nodes (its placement's gpus_per_node)")


def step_time(traffic: Traffic, link: str | Interconnect, device: str | Device | None = None,
              compute: ComputeSettings = DEFAULT_COMPUTE, host: HostTraffic | None = None,
              host_settings: HostSettings | None = None,
              overlap: Overlap | None = None) -> StepTime:
    """Seconds of each collective on its ring, the host transfers ``host`` (on
    ``host_settings``' links) and the CPU's optimizer step (on its host; default
    :data:`~zerolib.core.step.offload_traffic.DEFAULT_HOST_SETTINGS`), the compute (with a
    device) and what is exposed under ``overlap`` (None: the traffic's engine's own rule; see
    :func:`exposed_seconds`; the CPU step hides behind nothing). ``compute`` is the whole
    step's, over the traffic's micro-batches."""
    if not isinstance(traffic, Traffic):
        raise TypeError(f"traffic must be a Traffic, got {type(traffic).__name__}")
    rule = traffic.engine.overlap if overlap is None else overlap
    if not isinstance(rule, Overlap):
        raise TypeError(f"overlap must be an Overlap, got {type(overlap).__name__}")
    ic = interconnect(link)
    _check_node(traffic, ic)
    seconds, bandwidth = schedule_seconds(traffic, ic)
    zero = np.zeros(traffic.gpus.shape)
    settings = check_host_settings(host_settings)
    host_time = (dict.fromkeys(STEP_PHASES, zero) if host is None
                 else dict(host.seconds(settings.host_link, settings.nvme_link, settings)))
    cpu = zero if host is None else host.cpu_seconds(settings)
    compute_by_phase = exposed = None
    if device is not None:
        if not isinstance(compute, ComputeSettings):
            raise TypeError(f"compute must be a ComputeSettings, got {type(compute).__name__}")
        forward, backward = compute_seconds(traffic.params, get_device(device), compute)
        compute_by_phase = MappingProxyType({"forward": forward, "backward": backward})
        latency = {}
        for slot in GROUP_SLOTS:
            per_call, _ = ring_timing_of(ic, slot.kind, traffic.ring_gpus[slot.name],
                                         traffic.ring_stride[slot.name])
            latency[slot.name] = np.asarray(traffic.calls[slot.name], dtype=np.float64) * per_call
        exposed = dict(exposed_seconds(traffic, seconds, latency, host_time, forward, backward,
                                       rule))
        exposed["after_step"] = exposed["after_step"] + cpu   # after the backward, hidden by nothing
        exposed = MappingProxyType(exposed)
    return StepTime(seconds, bandwidth, MappingProxyType(host_time), compute_by_phase, exposed,
                    cpu_step=cpu, overlap=rule, engine=traffic.engine.name)


def exposed_seconds(traffic: Traffic, seconds, latency, host_time, forward, backward,
                    rule: Overlap) -> Mapping[str, np.ndarray]:
    """Seconds per phase the GPU waits for the network, over a step of m micro-batches (each
    computing 1/m of ``forward`` and ``backward``).

    Per micro-batch, the forward's gathers hide behind its forward (``rule.forward_hidden``) and
    the backward's collectives that run every micro-batch behind its backward at the stages of
    ``rule.backward_hidden``; the collectives run once (stages 0-1's reduction, the replicas'
    all-reduce, offload's copies) join the last micro-batch's backward. The post-step all-gather
    waits before the next step unless ``rule.post_step_gather_hidden`` (then it joins the first
    micro-batch's forward). ``rule.first_gather_exposed`` adds the first layer's gather (one
    call's share) of each micro-batch; ``rule.latency_exposed`` charges every call's latency
    outside the overlap."""
    m = traffic.micro_batches
    f, b = forward / m, backward / m
    charge = rule.latency_exposed
    zero = np.zeros(traffic.gpus.shape)
    each = {"forward": zero, "backward": zero}
    once = {"forward": host_time["forward"], "backward": host_time["backward"]}
    fixed = zero     # latency charged outside the overlap
    after = host_time["after_step"] + sum(seconds[s.name] for s in GROUP_SLOTS
                                          if s.phase == "after_step")
    for slot in GROUP_SLOTS:
        if slot.phase == "after_step":
            continue
        name = slot.name
        wire = seconds[name] - (latency[name] if charge else 0.0)
        if charge:
            fixed = fixed + latency[name]
        repeated = traffic.every_micro_batch[name]
        each[slot.phase] = each[slot.phase] + np.where(repeated, wire / m, 0.0)
        once[slot.phase] = once[slot.phase] + np.where(repeated, 0.0, wire)
    # The first layer's gather of each micro-batch waits (one call's share of the pass).
    if rule.first_gather_exposed:
        calls = traffic.calls["forward_all_gather"]
        first = np.where(calls > 0, seconds["forward_all_gather"] / np.maximum(calls, 1), 0.0)
    else:
        first = zero
    each_f = np.maximum(each["forward"] - first, 0.0)
    once_f = once["forward"]
    if rule.post_step_gather_hidden:   # the next forward starts on the first gathered bucket
        once_f, after = once_f + after, zero
    if rule.forward_hidden:   # what runs once joins the first micro-batch's forward
        forward_exposed = (m * first + (m - 1) * np.maximum(each_f - f, 0.0)
                           + np.maximum(each_f + once_f - f, 0.0))
    else:
        forward_exposed = m * each["forward"] + once_f
    hidden = np.isin(traffic.stage, rule.backward_hidden)
    each_b, once_b = each["backward"], once["backward"]
    backward_hidden = ((m - 1) * np.maximum(each_b - b, 0.0)
                       + np.maximum(each_b + once_b - b, 0.0))
    backward_exposed = np.where(hidden, backward_hidden, m * each_b + once_b)
    return MappingProxyType({"forward": forward_exposed + fixed,
                             "backward": backward_exposed, "after_step": after})
