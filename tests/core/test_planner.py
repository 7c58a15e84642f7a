"""The planner (zerolib.core.planner): the space enumerated by hand for a tiny model, every
reported peak equal to working_set.peaks for the same setting, every time equal to
parallel_step_time's, the ranking, and what is never reported as fitting."""
import numpy as np
import pytest

import zerolib as zl
from zerolib.core.catalogue.devices import Device
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.planner import PLAN_HEADER, PLAN_LEFT_OUT, RULES, describe_configuration
from zerolib.core.planner import plan as plan_for_engine
from zerolib.core.step.parallel import parallel_step_time


def plan(*args, **options):
    """The plans worked out here are the ZeRO paper's schedule (every stage with shard groups,
    DeepSpeed's pipeline rule); tests/core/step/test_engines.py holds the other engines'."""
    return plan_for_engine(*args, **{"engine": "paper", **options})

# A model small enough to enumerate by hand: 2 layers of hidden 8, 2 heads, MLP 16, vocabulary
# 10, no biases, untied. Per layer 4 x 8 x 8 (attention) + 2 x 8 x 16 (MLP) + 2 x 8 (norms)
# = 528; embedding and output layer 80 each, final norm 8: 1,224 parameters.
TINY = TransformerConfig("tiny", hidden=8, layers=2, heads=2, kv_heads=2, ffn_hidden=16, vocab=10,
                         max_positions=64, tied_embeddings=False, gated_mlp=False)
TINY_GPU = Device("tiny-gpu", "tiny GPU", 10_000, "a test device", peak_flops=10**12,
                  peak_dtype="bf16")
# No reserve, no DeepSpeed buckets, stage 3 gathering only the module it runs.
# no buffers and no reserve: the peak is model state and activations (a run's fields)
BARE_RUN = dict(reserve_bytes=0, reduce_bucket_size=0, max_live_parameters=0,
                prefetch_bucket_size=0, flash_attention=True)


@pytest.fixture(scope="module")
def tiny():
    return plan(TINY, 4, 2, TINY_GPU, 8, 4, links="nvlink4,ib-ndr", max_micro_batch=2,
                recompute=("none",), chunks=(1,), offload=("none",), **BARE_RUN)


@pytest.fixture(scope="module")
def llama70b():
    return plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024, host_memory=2**40)


def test_the_tiny_space_by_hand(tiny):
    # 4 GPUs in nodes of 2: (t, p, d) = (1,1,4) (1,2,2) (1,4,1) (2,1,2) (2,2,1) (4,1,1);
    # sequence parallelism on and off for t > 1; micro-batch 1 or 2; ZeRO variants: stage 0
    # (G = d) and stages 1-3 with every G dividing d: 10 for d = 4, 7 for d = 2, 4 for d = 1.
    #   (1,1,4): 2 micro-batches x 10 = 20, micro-batch 2 breaks d b | 4 (10)
    #   (1,2,2): 2 x 7 = 14, stages 2-3 with a pipeline (2 + 2 per micro-batch: 8)
    #   (1,4,1): 2 x 4 = 8, p = 4 > 2 layers
    #   (2,1,2): 2 SP x 2 x 7 = 28, all runnable
    #   (2,2,1): 2 x 2 x 4 = 16, stages 2-3 with a pipeline (2 per SP and micro-batch: 8)
    #   (4,1,1): 2 x 2 x 4 = 16, 4 does not divide the 2 heads
    # 102 configurations; 16 heads, 8 layers, 10 global batch, 16 pipeline + ZeRO-2/3; 52 runnable.
    assert tiny.counts()["configurations"] == 102
    assert tiny.counts()["runnable"] == 52
    by_rule = dict(zip(tiny.rejected["rule"], tiny.rejected["configurations"]))
    assert {k: v for k, v in by_rule.items() if k != "capacity"} == {
        "heads": 16, "layers": 8, "global_batch": 10, "pipeline_zero": 16}
    assert sum(by_rule.values()) + tiny.counts()["fit"] == 102


def test_tiny_peaks_by_hand(tiny):
    v = tiny.valid

    def row(**match):
        sel = np.ones(len(v), dtype=bool)
        for key, value in match.items():
            sel &= v[key].to_numpy() == value
        (index,) = np.flatnonzero(sel)
        return v.iloc[index]

    # t 1, p 1, d 4, micro-batch 1, seq 8. One layer saves (2-byte elements, s b h = 64): the
    # norms' and projections' inputs, Q, K, V and the attention output 8 x 128, flash's fp32
    # statistics 4 x 2 heads x 8 = 64, the MLP's two 16-wide tensors 2 x 256: 1,600; two layers
    # 3,200, plus the final norm's and output layer's inputs (128 each) and the logits, 2 + 4
    # bytes x 8 tokens x 10 = 480: 3,936 bytes.
    # Stage 3 over 4: 16 x ceil(1224 / 4) = 4,896, and the largest module gathered (the MLP's
    # 128 elements, 256 bytes): 9,088 bytes, which fits the 10,000 of the test device.
    stage3 = row(tensor_parallel=1, pipeline_parallel=1, stage=3, shard_group=4, micro_batch=1)
    assert stage3["peak_bytes"] == 4_896 + 3_936 + 256 == 9_088 and stage3["fits"]
    # Stage 0: 16 x 1,224 = 19,584, DDP's second copy of the gradients 2,448: 25,968.
    stage0 = row(tensor_parallel=1, pipeline_parallel=1, stage=0, micro_batch=1)
    assert stage0["peak_bytes"] == 19_584 + 2_448 + 3_936 == 25_968 and not stage0["fits"]
    # t 2, p 2, d 1, stage 0, micro-batch 1 (m = 4): a layer holds 4 x 64 / 2 + 2 x 128 / 2 + 16
    # = 272 on one GPU; the first stage one layer and half the embedding (5 rows of 8): 312.
    # A layer's activations at t = 2: norms' and the QKV and MLP inputs (replicated) 4 x 128, Q
    # and the attention output 2 x 64, K and V (one head each) 2 x 64, flash statistics 32, the
    # MLP's tensors 2 x 128: 1,056. 1F1B keeps min(p, m) = 2 micro-batches on the first stage:
    # 2,112. Peak 16 x 312 + 2 x 312 + 2,112 = 7,728. The last stage (one layer, half the output
    # layer and the final norm: 320; one micro-batch plus the final norm's and output layer's
    # inputs and 6 x 8 x 5 bytes of logits: 1,552) is 5,120 + 640 + 1,552 = 7,312: the first decides.
    grid = row(tensor_parallel=2, pipeline_parallel=2, sequence_parallel=False, stage=0,
               micro_batch=1)
    assert grid["micro_batches"] == 4
    assert grid["peak_bytes"] == 16 * 312 + 2 * 312 + 2_112 == 7_728
    assert grid["pipeline_stage"] == 0


def test_tiny_times_with_a_shard_group_and_offload_by_hand():
    # d = 4 in nodes of 2 (NVLink 4 inside, 450 GB/s; 2 NDR ports per node, 50 GB/s each), stage
    # 2, micro-batch 1 (m = 1), 40% of the test device's 1e12 FLOP/s: forward (2 x 1,144 + 256)
    # x 8 / 0.4e12 = 5.088e-8 s (the 1,224 parameters less the 80 of the embedding, looked up,
    # and the causal core, 2 layers x 8 tokens x 2 heads x (4 + 4)), backward twice that.
    # Everything communicated is exposed.
    result = plan(TINY, 4, 2, TINY_GPU, 8, 4, links="nvlink4,ib-ndr", max_micro_batch=1,
                  recompute=("none",), chunks=(1,), stages=(2,), sequence_parallel=(False,),
                  host_memory=2**30, **BARE_RUN, link_efficiency="line-rate")
    v = result.valid

    def seconds(**match):
        sel = np.ones(len(v), dtype=bool)
        for key, value in match.items():
            sel &= v[key].astype(str).to_numpy() == str(value)
        (index,) = np.flatnonzero(sel)
        return float(v["step_seconds"].iloc[index])

    forward = (2 * 1_144 + 2 * 8 * 2 * 8) * 8 / 0.4e12
    # G = 2, one node per group: the reduce-scatter sends 1 chunk of 612 x 2 bytes on NVLink,
    # 8.4 + 3.4 us + 1,224 / 450e9 s; the all-gather after the step the same. The replicas'
    # all-reduce, 2 GPUs on 2 nodes, each node's 2 such rings sharing its 100 GB/s: 2 x 306 x 2
    # = 1,224 B at 50 GB/s, 8.4 + 2 x 14.0 us. Step: forward + backward + (reduce-scatter -
    # backward) + all-reduce + all-gather.
    scatter = 11.8e-6 + 1_224 / 450e9
    replicas = 36.4e-6 + 1_224 / 50e9
    assert abs(seconds(tensor_parallel=1, shard_group=2, offload="none")
               - (forward + scatter + replicas + scatter)) < 1e-18
    # The optimizer on the CPU: the 612-element gradient partition, 1,224 B, goes down on PCIe 4.0
    # (31.5 GB/s) after the reduce-scatter, and as much comes up after the step.
    down = 1_224 / 31.5e9
    # Between them the CPU's Adam step: 612 elements x 30 B (12 B of state read and written, a
    # 4 B gradient read, a 2 B parameter written) at half (2 GPUs per node) of the default
    # host's 409.6 GB/s (DGX A100: 2 sockets x 8 channels x 3,200 MT/s x 8 B).
    cpu = 612 * 30 * 2 / 409.6e9
    assert abs(seconds(tensor_parallel=1, shard_group=2, offload="optimizer")
               - (forward + scatter + down + replicas + cpu + down + scatter)) < 1e-18
    # G = 1: no group collectives; the all-reduce over all 4 (2 per node, 100 GB/s, 4 NVLink
    # and 2 network steps: 8.4 + 4 x 3.4 + 2 x 14.0 = 50.0 us) of 2 x 3 x 306 x 2 = 3,672 B.
    # With the optimizer offloaded its 2,448-byte gradient copy (7.77e-8 s) fits inside the
    # backward's 1.02e-7 s, but the all-reduce after it does not; the parameters come up after.
    copy = 2_448 / 31.5e9
    assert abs(seconds(tensor_parallel=1, shard_group=1, offload="optimizer")
               - (forward + copy + 50.0e-6 + 3_672 / 100e9 + 1_224 * 30 * 2 / 409.6e9 + copy)
               ) < 1e-18
    # Offloaded configurations are ranked with the others: the fastest is that one, and a
    # configuration without offload sits between offloaded ones.
    fits = result.fits
    assert (fits.iloc[0]["shard_group"], fits.iloc[0]["offload"]) == (1, "optimizer")
    offloaded = (fits["offload"] != "none").to_numpy()
    assert offloaded[0] and not offloaded.all() and offloaded[-1]


def _same_as_working_set(result, rows):
    for _, row in rows.iterrows():
        run = result.run(row)
        ws, placement = run.working_set_settings(), run.placement()
        (peak,) = zl.peaks(result.settings.model, result.settings.gpus, [int(row["stage"])], ws,
                           result.settings.layout, placement)
        assert (peak.total, peak.pipeline_stage) == (row["peak_bytes"], row["pipeline_stage"]), \
            describe_configuration(row)


def test_every_tiny_peak_is_working_set_peaks(tiny):
    _same_as_working_set(tiny, tiny.valid)
    capacity = TINY_GPU.capacity
    assert (tiny.valid["fits"] == (tiny.valid["peak_bytes"] <= capacity)).all()


def test_every_reported_peak_of_a_small_plan_is_working_set_peaks():
    result = plan("llama-2-7b", 16, 8, "a100-40gb", 2048, 64, max_micro_batch=1,
                  host_memory=512 * 2**30)
    assert len(result.fits) > 100
    _same_as_working_set(result, result.fits)


def test_sampled_peaks_of_llama_70b_are_working_set_peaks(llama70b):
    valid = llama70b.valid
    picks = np.random.default_rng(13).choice(len(valid), 120, replace=False)
    _same_as_working_set(llama70b, valid.iloc[np.sort(picks)])
    _same_as_working_set(llama70b, llama70b.fits.head(20))


def test_times_are_parallel_step_time(llama70b):
    valid = llama70b.valid
    picks = np.random.default_rng(7).choice(len(valid), 300, replace=False)
    top = valid.iloc[np.sort(picks)]
    assert (top["offload"] != "none").any() and (top["shard_group"] < top["data_parallel"]).any()
    s = llama70b.settings
    times = parallel_step_time(
        s.model, s.interconnect, s.device, seq_len=s.seq_len, micro_batch=top["micro_batch"],
        tensor_parallel=top["tensor_parallel"], pipeline_parallel=top["pipeline_parallel"],
        data_parallel=top["data_parallel"], stage=top["stage"], micro_batches=top["micro_batches"],
        chunks=top["chunks"], sequence_parallel=top["sequence_parallel"].to_numpy(),
        recompute=top["recompute"].astype(str).to_numpy(), shard_group=top["shard_group"],
        offload=top["offload"].astype(str).to_numpy(), host_link="pcie4-x16", engine=s.engine)
    assert np.allclose(times.step_seconds, top["step_seconds"], rtol=1e-12)


def test_ranked_by_step_time_then_headroom(llama70b):
    fits = llama70b.fits
    step, room = fits["step_seconds"].to_numpy(), fits["headroom_bytes"].to_numpy()
    assert not np.isnan(step).any()
    assert (np.diff(step) >= 0).all()
    ties = np.diff(step) == 0
    assert (np.diff(room)[ties] <= 0).all()
    assert list(fits["rank"]) == list(range(1, len(fits) + 1))


def test_counts_add_up(llama70b):
    counts = llama70b.counts()
    assert counts["fit"] == len(llama70b.fits) == int(llama70b.valid["fits"].sum())
    assert llama70b.rejected["configurations"].sum() == counts["rejected"]
    assert counts["configurations"] == counts["fit"] + counts["rejected"]
    assert set(llama70b.rejected["rule"]) <= set(RULES)


def test_never_fits_with_an_unknown_term():
    # Without the node's CPU memory an offloaded configuration has an unknown term: rejected.
    blind = plan("llama-2-70b", 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1)
    assert (blind.fits["offload"] == "none").all()
    assert "host_unknown" in set(blind.rejected["rule"])
    # With it, the host is judged: a small host memory rejects what would fit the GPU.
    small = plan("llama-2-70b", 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1,
                 host_memory=64 * 2**30)
    big = plan("llama-2-70b", 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1,
               host_memory=4 * 2**40)
    assert "host_memory" in set(small.rejected["rule"])
    offloaded = big.fits[big.fits["offload"] != "none"]
    assert len(offloaded) and (offloaded["host_bytes_per_node"] <= 4 * 2**40).all()
    assert offloaded["step_seconds"].notna().all()         # timed, and ranked with the rest
    assert (small.fits["host_bytes_per_node"] <= 64 * 2**30).all()


def test_the_host_is_judged_on_the_heavier_pipeline_stage():
    result = plan("llama-2-70b", 32, 8, "a100-80gb", 4096, 64, max_micro_batch=1,
                  host_memory=2**40, stages=(1,), offload=("optimizer",))
    for _, row in result.valid.head(40).iterrows():
        placement = result.run(row).placement()
        on_node = []
        for r in {0, int(row["pipeline_parallel"]) - 1}:
            params = int(zl.parameters_per_gpu("llama-2-70b", int(row["tensor_parallel"]),
                                               int(row["pipeline_parallel"]), pipeline_stage=r))
            on_node.append(int(zl.place(params, int(row["data_parallel"]), 1,
                                        placement=placement, world=32).per_node("cpu")))
        assert row["host_bytes_per_node"] == max(on_node)


def test_honesty_is_stated():
    assert "not by measurement" in PLAN_HEADER
    text = " ".join(PLAN_LEFT_OUT)
    for omitted in ("kernel efficiency per shape", "pipeline bubbles beyond the schedule formula",
                    "fragmentation"):
        assert omitted in text


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="gpus .* must fill whole nodes"):
        plan("llama-2-7b", 12, 8, "a100-80gb", 4096, 64)
    with pytest.raises(ValueError, match="global_batch"):
        plan("llama-2-7b", 8, 8, "a100-80gb", 4096, 0)
    with pytest.raises(ValueError, match="stages must be from"):
        plan("llama-2-7b", 8, 8, "a100-80gb", 4096, 64, stages=(4,))
    with pytest.raises(ValueError, match="links must be given for rtx4090"):
        plan("llama-2-7b", 8, 8, "rtx4090-24gb", 4096, 64)
    with pytest.raises(ValueError, match="seq_len must be at most 1024"):
        plan("gpt2", 8, 8, "a100-80gb", 2048, 64)
    with pytest.raises(ValueError, match="host_link must be a PCIe link"):
        plan("llama-2-7b", 8, 8, "a100-80gb", 4096, 64, host_link="ib-ndr")
    with pytest.raises(ValueError, match="more than"):
        plan("llama-2-7b", 2**20, 8, "a100-80gb", 4096, 2**20, max_micro_batch=1024)


def test_describe_reads():
    row = {"tensor_parallel": 8, "pipeline_parallel": 4, "data_parallel": 2,
           "sequence_parallel": True, "chunks": 1, "stage": 1, "shard_group": 2,
           "recompute": "selective", "micro_batch": 1, "micro_batches": 512, "offload": "none"}
    assert describe_configuration(row) == ("t 8 + SP x p 4 (1F1B) x d 2, ZeRO-1, selective recomputation, "
                             "micro-batch 1 x 512, no offload")


def test_each_row_is_a_run_that_estimate_answers_alike():
    # The planner's output is runs: estimate of a row's run gives the row's peak, its most
    # loaded pipeline stage and, on the plan's links, its step time (one model, two doors).
    result = plan("llama-2-70b", 64, 8, "h100-80gb", 4096, 1024, max_micro_batch=2)
    rows = result.valid.iloc[::97]
    assert len(rows) > 20
    for _, row in rows.iterrows():
        (found,) = zl.estimate(result.run(row)).stages
        assert (found["peak"], found["pipeline_stage"]) == (row["peak_bytes"], row["pipeline_stage"])
        timed = found["parallel_step"] if "parallel_step" in found else found["communication"]
        assert timed["step_seconds"] == pytest.approx(float(row["step_seconds"]), rel=1e-9), \
            describe_configuration(row)
    # and a run file carries it: written and read back, the same run
    from zerolib.core.run_file import run_from_toml
    run = result.run(result.fits.iloc[0])
    assert run_from_toml(run.to_toml()) == run
