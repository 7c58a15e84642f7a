"""The planner: every configuration of Llama-2-70B on 1,024 H100 GPUs (nodes of 8, sequence
4,096, global batch 1,024, the default schedules: 1F1B and every number of model chunks v with
p x v dividing the 80 layers), through the vectorised planner versus a plain-Python enumeration
of the same space, versus the same plan over ``--chunks 1,2`` only, and versus the same plan
without ZeRO-R's P_a (``zero_r=("none",)``), and the plan under engine torchtitan (its memory
convention: FSDP2's unsharded units, the judged reserved peak) versus that last, in the same
run (medians).

The plain-Python side walks the space in nested loops, one configuration at a time, in the
planner's order: the rules as Python conditions, then for each configuration that can run its
peak (model state placed by ``place``, activations by ``stage_activation_terms``, DeepSpeed's
buffers and the reserve in Python integers) and its step time (the parts
``parallel_step_time`` sums: compute, the tensor-parallel rows and ZeRO-R's P_a all-gather, the
ring attention's sends and the experts' all-to-alls (none here: C = 1, a dense model), the
pipeline's messages, ZeRO's collectives and the bubble, in Python floats). Under full
recomputation with t > 1 and no sequence parallelism each configuration that can run comes
again with P_a (searched here beside none; off by default): the checkpoints kept at 1 / t, one
all-gather of each layer's checkpoint per micro-batch. The library
calls whose arguments repeat are remembered (``functools.lru_cache``), as a careful plain-Python
planner would. Both sides must agree on every configuration: the reason it is rejected, its peak
to the byte, its step time to 1e-9.
"""
from __future__ import annotations

from functools import cache

import numpy as np
from timing import median_seconds, size

from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import (
    Pipeline,
    _all_chunks,
    largest_module_per_gpu,
    parameters_per_gpu,
)
from zerolib.core.memory.pipeline_schedule import _unit_terms_cached, stage_activation_terms, unit_terms
from zerolib.core.memory.placement import Placement, offered_stages, place
from zerolib.core.memory.tables import divisors
from zerolib.core.planner import (
    _MEMORY,
    OFFLOADS,
    PASSES,
    REASONS,
    _variants,
    plan_from,
    plan_settings,
)
from zerolib.core.step.collectives import CHUNKS_SENT, ring_timing
from zerolib.core.step.model_parallel_traffic import _check_setting
from zerolib.core.step.offload_traffic import host_traffic
from zerolib.core.step.parallel import _pipeline_sends, _tensor_rows
from zerolib.core.step.time import send_seconds
from zerolib.core.step.traffic import layer_units

# The plain-Python side walks the paper's schedule (every stage in groups, its overlap rule).
SETTING = dict(run="llama-2-70b", gpus=size(1024, 64), gpus_per_node=8, device="h100-80gb", seq_len=4096,
               global_batch=1024, host_memory=2 * 2**40, engine="paper")
SEARCHED = ("none", "partition")   # ZeRO-R's P_a beside none (--partition-activations search)


def python_plan(s):
    """(reason, peak, step seconds) per configuration, in the planner's order."""
    config, n, k, seq = s.model, s.gpus, s.gpus_per_node, s.seq_len
    ws, layout, ic = s.working_set, s.layout, s.interconnect
    grad, param = layout.bits_per_param("gradients") // 8, layout.bits_per_param("parameters") // 8
    rate = s.device.peak_flops * s.mfu
    units = len(layer_units(config))

    @cache
    def on_gpu(t, p, r):
        return (int(parameters_per_gpu(config, t, p, pipeline_stage=r)),
                int(largest_module_per_gpu(config, t, p, pipeline_stage=r)))

    @cache
    def activations(t, p, r, v, b, sp, rec, m, pa=False):
        terms = stage_activation_terms(
            config, seq, b, t, Pipeline(p, "interleaved" if v > 1 else "1f1b", v, m), r,
            ActivationOptions(sp, rec, ws.flash_attention, ws.element_bytes, ws.mask_bytes,
                              ws.dropout, ws.logits_bytes))
        total = sum(terms.values())
        if pa:   # the stored checkpoints (s b h elements each, whole) kept at 1 / t
            whole = ws.element_bytes * seq * b * config.hidden
            held, rest = divmod(terms["transformer_layers"], whole)
            assert rest == 0
            total -= held * (whole - ws.element_bytes * -(-(seq * b * config.hidden) // t))
        return total

    @cache
    def placed(params, d, stage, group, offload):
        placement = Placement(shard_group=group, gpus_per_node=k, **OFFLOADS[offload])
        tiers = place(params, d, stage, layout, placement, world=n)
        return int(tiers.gpu), int(tiers.per_node("cpu"))

    @cache
    def host_seconds(params, d, stage, group, offload):
        placement = Placement(shard_group=group, gpus_per_node=d, **OFFLOADS[offload])
        traffic = host_traffic(params, d, stage, layout, placement)
        # The node's k GPUs share its host: its drives and the CPU's optimizer step, which
        # runs once per step after the last backward, before the updated partition comes up.
        seconds = traffic.seconds(s.host_link, None, s.host, k)
        cpu = float(traffic.cpu_seconds(s.host, k))
        return {phase: float(value) + (cpu if phase == "after_step" else 0.0)
                for phase, value in seconds.items()}

    @cache
    def ring_constants(size, stride):
        """({kind: latency}, {kind: bus bandwidth}) of one ring, as Python floats (the package's
        one ring model, asked once per distinct ring; an all-reduce inside an H100 node runs on
        NVLS, faster than the ring's other kinds)."""
        timing = {kind: ring_timing(ic, kind, size, stride) for kind in CHUNKS_SENT}
        return ({kind: float(latency) for kind, (latency, _) in timing.items()},
                {kind: float(bandwidth) for kind, (_, bandwidth) in timing.items()})

    def ring(size, stride, kind, sent, calls):
        if size == 1 or sent == 0:
            return 0.0
        latency, bandwidth = ring_constants(size, stride)
        return calls * latency[kind] + sent / bandwidth[kind]

    def stage_time(t, p, d, r, v, b, sp, rec, stage, m, group, offload, pa=False):
        params = on_gpu(t, p, r)[0]
        full = rec == "full"
        # The first stage looks its share of the input embedding's rows up: no FLOPs
        # (docs/flops.md); with tied embeddings on one stage the table is the output
        # projection too, multiplied.
        looked_up = 0
        if r == 0 and not (config.tied_embeddings and p == 1):
            looked_up = -(-config.vocab // t) * config.hidden
        multiplied = params - looked_up
        # The causal attention core (flash attention) of this GPU's heads and the stage's
        # layers, Q K^T and attention over V: forward once, backward twice, and once more
        # when recomputed (selective or full).
        layers = config.layers // p + (r < config.layers % p)
        core = seq * -(-config.heads // t) * 2 * config.head_width * layers
        forward = (2 * multiplied + core) * seq / rate * b
        backward = ((6 if full else 4) * multiplied + (3 if rec != "none" else 2) * core) * seq / rate * b
        tensor = 0.0
        if t > 1:
            for kind, calls, size in _tensor_rows(config, seq, p, r, sp, rec, ws.element_bytes):
                latency, bandwidth = ring_constants(t, 1)
                sent = CHUNKS_SENT[kind] * (t - 1) * -(-(size * b) // t)
                tensor += calls * (latency[kind] + sent / bandwidth[kind])
        if pa:   # P_a: each layer's checkpoint all-gathered before it is recomputed
            latency, bandwidth = ring_constants(t, 1)
            layers = config.layers // p + (r < config.layers % p)
            whole = ws.element_bytes * seq * b * config.hidden
            tensor += layers * (latency["all_gather"] + (t - 1) * -(-whole // t) / bandwidth["all_gather"])
        context = expert = 0.0     # C = 1 and a dense model: no ring attention, no all-to-alls
        pipe = 0.0
        if p > 1:
            count, size = _pipeline_sends(config, seq, t, p, r, sp, v, ws.element_bytes)
            pipe = count * float(send_seconds(ic, size * b, t * d * p > k))
        # ZeRO's collectives: the group's ring (G GPUs t apart), the replicas' (d / G GPUs
        # G t apart), stage 0's all-reduce over all d; one call per layer unit under stage 3.
        calls = units if stage == 3 else 1
        shard = -(-params // group)
        group_pass = (group - 1) * shard
        gather_f = ring(group, t, "all_gather", group_pass * param, calls) if stage == 3 else 0.0
        gather_b = gather_f
        scatter = ring(group, t, "reduce_scatter", group_pass * grad, calls) if stage >= 1 else 0.0
        replicas = d // group
        # G = 1 is plain data parallelism whatever the stage (traffic's _plain): one bucketed
        # all-reduce of the gradients, not one per layer unit.
        replica = (ring(replicas, group * t, "all_reduce",
                        2 * (replicas - 1) * -(-shard // replicas) * grad,
                        1 if group == 1 else calls)
                   if stage >= 1 else 0.0)
        reduce0 = ring(d, t, "all_reduce", 2 * (d - 1) * -(-params // d) * grad, 1) if stage == 0 else 0.0
        host = host_seconds(params, d, stage, group, offload)
        gather_f += host["forward"]
        in_backward = gather_b + (scatter + host["backward"] if stage >= 2 else 0.0)
        per_mb = max(gather_f - forward, 0.0) + max(in_backward - backward, 0.0)
        # Once per step, in the last micro-batch's backward; then the after-step traffic.
        once = reduce0 + replica + (scatter + host["backward"] if stage == 1 else 0.0)
        last = max(in_backward + once - backward, 0.0) - max(in_backward - backward, 0.0)
        after = ring(group, t, "all_gather", group_pass * param, 1) if stage in (1, 2) else 0.0
        per_step = last + after + host["after_step"]
        return forward + backward, tensor, context, expert, pipe, per_mb, per_step

    assert "partition+cpu" not in s.zero_r     # P_a+cpu is not walked here
    judged = _judge(s, on_gpu, placed, activations, stage_time)
    out = []
    for t in divisors(n):
        for p in divisors(n // t):
            d = n // (t * p)
            variants = []
            for offload in s.offload:
                offered = offered_stages(Placement(**OFFLOADS[offload]))
                for stage in s.stages:
                    if stage in offered:
                        groups = divisors(d)[::-1] if stage > 0 and s.shard_groups == "all" else [d]
                        variants += [(stage, g, offload) for g in groups]
            # The default schedules: 1F1B and every v >= 2 with p x v dividing the layers.
            schedules = s.chunks if s.chunks != "all" else [1] + [
                v for v in range(2, config.layers // p + 1) if p > 1 and config.layers % (p * v) == 0]
            for v in schedules:
                for sp in s.sequence_parallel:
                    if sp and t == 1:
                        continue
                    broken = [("heads", config.heads % t), ("kv_heads", config.kv_heads % t),
                              ("ffn_hidden", config.ffn_hidden % t), ("node", t > k or k % t),
                              ("sequence", sp and seq % t), ("layers", p > config.layers),
                              ("interleaved_layers", v > 1 and config.layers % (p * v)),
                              ("schedule", (p < 2 or v < 2) if v > 1 else v != 1)]
                    rule = next((name for name, bad in broken if bad), None)
                    for b in range(1, s.max_micro_batch + 1):
                        whole = s.global_batch % (d * b) == 0
                        m = s.global_batch // (d * b) if whole else 1
                        level = rule or (None if whole else "global_batch")
                        level = level or ("micro_batches" if v > 1 and m % p else None)
                        for rec in s.recompute:
                            for stage, group, offload in variants:
                                reason = level or ("pipeline_zero" if p > 1 and stage > 1 else None)
                                if reason is None and offload != "none" and s.host_memory is None:
                                    reason = "host_unknown"
                                if reason is not None:
                                    out.append((REASONS.index(reason), None, None))
                                    continue
                                splits = rec == "full" and t > 1 and not sp
                                options = dict.fromkeys(name == "partition" and splits
                                                        for name in s.zero_r)
                                for pa in options:
                                    out.append(judged(t, p, d, v, b, sp, rec, m, stage, group,
                                                      offload, pa))
    return out


def _judge(s, on_gpu, placed, activations, stage_time):
    """The judging of one configuration that can run: (reason, peak, step seconds)."""
    ws = s.working_set
    grad, param = (s.layout.bits_per_param("gradients") // 8,
                   s.layout.bits_per_param("parameters") // 8)

    def judged(t, p, d, v, b, sp, rec, m, stage, group, offload, pa):
        peaks, hosts, times = [], [], []
        for r in dict.fromkeys((0, p - 1)):
            params, module = on_gpu(t, p, r)
            gpu, cpu = placed(params, d, stage, group, offload)
            work = activations(t, p, r, v, b, sp, rec, m, pa) + ws.reserve_bytes
            if stage == 0:
                work += grad * params
            else:
                work += grad * ws.reduce_bucket_size
            if stage == 3:
                work += param * min(params, max(ws.max_live_parameters,
                                                module + ws.prefetch_bucket_size))
            peaks.append(gpu + work)
            hosts.append(cpu)
            times.append(stage_time(t, p, d, r, v, b, sp, rec, stage, m, group,
                                   offload, pa))
        peak = max(peaks)
        # The parts of one micro-batch, every one parallel_step_time sums
        # (all but the per-step collectives, the last).
        slow = max(times, key=lambda x: sum(x[:-1]))
        micro = sum(slow[:-1])
        step = m * micro + slow[-1] + (p - 1) / v * micro
        if peak > s.device.capacity:
            reason = REASONS.index("capacity")
        elif s.host_memory is not None and max(hosts) > s.host_memory:
            reason = REASONS.index("host_memory")
        else:
            reason = PASSES
        return reason, peak, step
    return judged


def vectorised(s):
    """The plan and its ranked frame, as the CLI and the notebook use them."""
    result = plan_from(s)
    return result, result.fits


def clear_memos():
    """Every memo both sides share, and the planner's own, emptied: each timed run starts cold,
    as a fresh process."""
    for memo in (_unit_terms_cached, unit_terms, _tensor_rows, _pipeline_sends, _variants, _check_setting,
                 _all_chunks):
        memo.cache_clear()
    _MEMORY.clear()


def main():
    s = plan_settings(**SETTING, zero_r=SEARCHED)
    result, _ = vectorised(s)
    looped = python_plan(s)
    assert len(looped) == result.size
    assert [r for r, _, _ in looped] == result.reason.tolist()
    peaks = np.array([looped[i][1] for i in result.runnable.tolist()], dtype=np.int64)
    steps = np.array([looped[i][2] for i in result.runnable.tolist()], dtype=np.float64)
    assert np.array_equal(peaks, result.results["peak_bytes"])
    assert np.allclose(steps, result.results["step_seconds"], rtol=1e-9, equal_nan=True)
    narrow = plan_settings(**SETTING, chunks=(1, 2), zero_r=SEARCHED)
    narrow_size = plan_from(narrow).size
    plain = plan_settings(**SETTING)   # the default: no ZeRO-R, as DeepSpeed's own
    plain_size = plan_from(plain).size
    fast = median_seconds(lambda: vectorised(s), 7, before=clear_memos)
    before = median_seconds(lambda: vectorised(narrow), 7, before=clear_memos)
    no_zero_r = median_seconds(lambda: vectorised(plain), 7, before=clear_memos)
    slow = median_seconds(lambda: python_plan(s), 3, before=clear_memos)
    # torchtitan's convention: FSDP2's unsharded units and the judged (reserved) peak per row
    titan = plan_settings(**{**SETTING, "engine": "torchtitan"})
    titan_size = plan_from(titan).size
    titan_seconds = median_seconds(lambda: vectorised(titan), 7, before=clear_memos)
    print(f"planner-70b-1024-gpus: {slow / fast:.0f}x ({result.size:,} configurations of "
          f"Llama-2-70B on {SETTING['gpus']:,} H100s, every schedule the layers allow, {len(result.runnable):,} "
          f"runnable, {len(result.fits):,} fit: vectorised plan {fast * 1e3:.0f} ms vs a "
          f"plain-Python enumeration of the same space {slow * 1e3:,.0f} ms, medians; target "
          f"< 1 s and >= 10x)")
    print(f"planner-all-schedules: {fast / before:.2f}x (the default search over every v with "
          f"p x v dividing the layers, {result.size:,} configurations, {fast * 1e3:.0f} ms vs "
          f"--chunks 1,2, {narrow_size:,} configurations, {before * 1e3:.0f} ms, medians; "
          f"target: the plan stays < 1 s)")
    # FSDP2 (torchtitan) runs ring attention, so its plan searches C = 1, 2, 4, 8, 16 by default:
    # every configuration once per degree, against the same plan at C = 1.
    with_cp = plan_settings(**dict(SETTING, engine="fsdp2"))
    at_one = plan_settings(**dict(SETTING, engine="fsdp2"), context_parallel=(1,))
    cp_size, one_size = plan_from(with_cp).size, plan_from(at_one).size
    searched = median_seconds(lambda: vectorised(with_cp), 7, before=clear_memos)
    alone = median_seconds(lambda: vectorised(at_one), 7, before=clear_memos)
    print(f"planner-context-parallel: {searched / alone:.2f}x (FSDP2's default search, C = "
          f"{', '.join(map(str, with_cp.context_parallel))}, {cp_size:,} configurations, "
          f"{searched * 1e3:.0f} ms vs C = 1 alone, {one_size:,} configurations, {alone * 1e3:.0f} ms, "
          f"medians; target: the plan stays < 1 s)")
    print(f"planner-zero-r: {fast / no_zero_r:.2f}x (the search with ZeRO-R's P_a "
          f"beside none, {result.size:,} configurations, {fast * 1e3:.0f} ms vs the default, none, "
          f"{plain_size:,} configurations, {no_zero_r * 1e3:.0f} ms, medians; target: the plan "
          f"stays < 1 s)")
    print(f"planner-torchtitan: {titan_seconds / no_zero_r:.2f}x (engine torchtitan, its memory "
          f"convention per row, {titan_size:,} configurations, {titan_seconds * 1e3:.0f} ms vs "
          f"the paper's count, {plain_size:,} configurations, {no_zero_r * 1e3:.0f} ms, medians; "
          f"target: the plan stays < 1 s)")


if __name__ == "__main__":
    main()
