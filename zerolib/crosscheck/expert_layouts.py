"""Published mixture-of-experts training layouts, judged by zerolib's expert-parallel count.

Each :class:`MoeLayout` is a layout someone trained with, as published, with what zerolib had to
assume beside it (``assumed``); :func:`judge` gives the model state per GPU with and without
expert parallelism and the peak on the device (:func:`zerolib.core.estimate.estimate_model` with
``expert_parallel``). The rows are not in ``data/trained_configurations.csv``, whose judge does
not yet take expert parallelism.

- **DeepSeek-V3** (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv 2412.19437, Sec. 3.2: "16-way
  Pipeline Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1 Data
  Parallelism (DP)" on 2,048 H800 GPUs; Sec. 3.3: BF16 AdamW moments, FP32 master weights and
  gradients; Sec. 4.2: sequence length 4K). No tensor parallelism, so d = 2048 / 16 = 128 and
  the experts' group 128 / 64 = 2. The shape is its ``config.json`` (671,026,404,352 parameters
  without the multi-token-prediction module).
- **Mixtral-8x7B in Megatron-Core** (NVIDIA Megatron-Core MoE documentation: 468 TFLOPS per H100
  for Mixtral 8x7B bf16 training with MCore v0.9, on 64 H100 with t = 1, p = 4, E = 8 as its
  benchmark table gives it): d = 16, the experts' group 16 / 8 = 2, the distributed optimizer
  (ZeRO-1) and Megatron-LM's 18 bytes per parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.catalogue.models import TransformerConfig, get_model, parameter_count
from zerolib.core.estimate import estimate_model
from zerolib.core.memory.accounting import Layout
from zerolib.core.memory.expert_parallel import expert_model_state
from zerolib.core.memory.working_set import WorkingSetSettings

# DeepSeek-V3's config.json shape fields (the same dict tests/core/catalogue/test_hf_config.py counts).
DEEPSEEK_V3_CONFIG = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 163840, "tie_word_embeddings": False}
# BF16 weights, FP32 gradients, FP32 master weights + BF16 Adam moments (Sec. 3.3): 2 + 4 + 8.
DEEPSEEK_V3_LAYOUT = Layout.custom(2, 4, 8)


@dataclass(frozen=True)
class MoeLayout:
    name: str
    source: str
    model: TransformerConfig = field(repr=False)
    gpus: int
    device: str
    pipeline_parallel: int
    expert_parallel: int
    zero_stage: int
    layout: str | Layout
    seq_len: int
    tensor_parallel: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    assumed: str = ""

    @property
    def data_parallel(self) -> int:
        return self.gpus // (self.tensor_parallel * self.pipeline_parallel)


def layouts() -> tuple[MoeLayout, ...]:
    """The published layouts (built when asked: DeepSeek-V3's config is read then)."""
    deepseek = model_from_config(DEEPSEEK_V3_CONFIG, name="deepseek-v3")
    return (
        MoeLayout("deepseek-v3", "arXiv 2412.19437 Sec. 3.2-3.3", deepseek, 2048, "h100-80gb", 16, 64,
                  1, DEEPSEEK_V3_LAYOUT, 4096, recompute="full",
                  assumed="H800 judged as an H100 80GB (the same 80 GB); 1F1B in place of DualPipe "
                          "(which keeps two copies of the parameters); micro-batch 1; full "
                          "recomputation in place of recomputing norms and MLA up-projections; "
                          "no FP8 activations; no multi-token-prediction module"),
        MoeLayout("mixtral-8x7b-megatron-core", "Megatron-Core MoE documentation (MCore v0.9)",
                  get_model("mixtral-8x7b"), 64, "h100-80gb", 4, 8, 1, "bf16-fp32-grads", 4096,
                  recompute="full",
                  assumed="sequence 4096, micro-batch 1, full recomputation, dropless routing"),
    )


def judge(layout: MoeLayout) -> dict:
    """Model state per GPU without and with expert parallelism, and the peak with it."""
    t, p, d, e = layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel, layout.expert_parallel
    without = expert_model_state(layout.model, t, p, d, layout.zero_stage, layout.layout)
    with_ep = expert_model_state(layout.model, t, p, d, layout.zero_stage, layout.layout,
                                 expert_parallel=e)
    settings = WorkingSetSettings(seq_len=layout.seq_len, micro_batch=layout.micro_batch,
                                  tensor_parallel=t, pipeline_parallel=p, recompute=layout.recompute)
    row = estimate_model(layout.model, layout.gpus, settings, layout.layout, layout.device,
                         (layout.zero_stage,), expert_parallel=e).as_dict()["stages"][0]
    return {"run": layout.name, "parameters": parameter_count(layout.model), "gpus": layout.gpus,
            "tensor_parallel": t, "pipeline_parallel": p, "data_parallel": d, "expert_parallel": e,
            "expert_data_parallel": with_ep.layout.expert_data_parallel,
            "zero_stage": layout.zero_stage,
            "model_state_without_ep": without.total, "model_state_with_ep": with_ep.total,
            "peak_pipeline_stage": row["pipeline_stage"], "working_set": sum(row["working_set"].values()),
            "peak": row["peak"], "fits": row["fits"], "assumed": layout.assumed}
