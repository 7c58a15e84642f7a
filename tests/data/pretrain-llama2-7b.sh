# Megatron-LM arguments of a Llama-2-7B run (pretrain_gpt.py), as a launch script holds them
--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 \
--max-position-embeddings 4096 --vocab-size 32000 --make-vocab-size-divisible-by 1 \
--swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
--untie-embeddings-and-output-weights \
--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 \
--bf16 --use-distributed-optimizer --recompute-activations \
--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0
