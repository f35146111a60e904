"""Cost model of one rollout engine: model profiles for the paper's three setups.

An *engine* is one SGLang server of ``gpus_per_engine`` GPUs. Its attention runs on
``attn_dp`` data-parallel ranks of ``gpus_per_rank`` GPUs each (attention tensor parallel
inside a rank); its experts are sharded over all the engine's GPUs (EP). Every engine step
ends in the MoE all-to-all, so the step takes as long as its SLOWEST rank: a rank that runs a
prefill chunk makes every decoding rank wait (the paper's §3.2 interference).

All times are in seconds and are per rank and per engine step. The public API:

* :data:`PROFILES` / :func:`get_profile` -- ``"qwen3-235b"``, ``"deepseek-v3.2"``,
  ``"mimo-v2.5-pro"``.
* :meth:`ModelProfile.prefill_time` (one chunk on one rank),
  :meth:`ModelProfile.decode_step_time` (one decode step of one rank's batch),
  :meth:`ModelProfile.kv_transfer_time` (prefill -> decode engine),
  :meth:`ModelProfile.switch_time` (``"in_place"`` or ``"restart"``),
  :attr:`ModelProfile.kv_capacity_per_rank` / :attr:`ModelProfile.kv_capacity_tokens`.

Sources (every constant below names one; ``CHOICE`` marks a value we had to pick):

* [P] the paper (shared/reference/prorsa-paper.txt §5.1): 16 servers x 8 GPUs, NVLink,
  8 x 400 Gbps RDMA NICs per server; FP8 weights; chunk 4096 (Qwen3, MiMo) and 512
  (DeepSeek-V3.2); EP4 + attention TP2 (Qwen3), EP16 + attention DP16 (DeepSeek-V3.2),
  EP16 + attention TP8 (MiMo).
* [LMSYS] "Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism
  on 96 H100 GPUs" (SGLang blog, 2025-05): 52.3k input tok/s and 22.3k output tok/s per
  8-GPU node for 2000-token inputs.
* [HF] the models' public configs: Qwen3-235B-A22B (94 layers, 4 KV heads x 128, 22B
  active, 128 experts of 3x4096x1536); DeepSeek-V3/V3.2 (61 layers, MLA latent 512 + rope
  64, 37B active, 58 MoE layers x 256 experts of 3x7168x2048; V3.2 adds a 128-dim FP8
  indexer key per token per layer and sparse attention over the top 2048 keys).
* [SGL] SGLang 0.5.23 (shared/reference/sglang-facts.md): restart of Qwen3-235B FP8 on 4
  GPUs ~6.5 min; in-place ``/pd_role_switch`` exists but stock 0.5.23 refuses it with EP > 1.
* [DYN] NVIDIA Dynamo mocker defaults (shared/DESIGN.md), used as a shape cross-check:
  prefill ms = 4.209989e-7 T^2 + 0.01518344 T + 16.50142; decode ms = -25.74u^2 + 54.01u +
  5.74; KV transfer 64 GB/s.
* [DEEPEP] deepseek-ai/DeepEP README, low-latency kernels on H800 + CX7 400 Gb/s, DeepSeek-V3
  setting (128 tokens per batch, hidden 7168, top-8, FP8 dispatch, BF16 combine): EP16
  dispatch 118 us, combine 195 us per MoE layer. Normal (prefill) kernels make the CPU wait
  for the GPU's receive counts, so they cannot run inside a CUDA graph.
* [SGL-DPA] SGLang with attention DP: ``--chunked-prefill-size`` is divided by the DP size
  (``server_args._handle_data_parallelism``), which is why [P]'s chunk sizes are 8192 / attn_dp
  (4096 at DP2, 512 at DP16). Every step all-gathers each rank's forward mode and ORs
  ``is_extend_in_batch``; DeepEP's ``auto`` mode then resolves to the NORMAL kernels on every
  rank (``layers/moe/utils.py: DeepEPMode.resolve``), and decode CUDA graphs (captured with the
  low-latency kernels) cannot replay. So while any rank prefills, the decoding ranks of the
  same engine run their decode step eagerly with normal-mode all-to-all: the extend-step
  penalty of :meth:`ModelProfile.decode_step_time`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """The accelerator the profiles assume.

    The paper does not name its GPU. CHOICE: an H200-class part (141 GB HBM3e, 4.8 TB/s),
    because the paper's Qwen3-235B FP8 on EP4 (4 GPUs) "while reserving sufficient KV-cache
    space for agentic RL rollout" leaves almost no KV space on 80 GB parts.
    """

    name: str = "H200-class"
    memory_gb: float = 141.0
    hbm_bytes_per_s: float = 4.8e12
    # CHOICE: decode kernels reach ~60% of peak HBM bandwidth (typical of measured
    # memory-bound GEMV/attention kernels).
    hbm_efficiency: float = 0.6
    # [P] eight 400 Gbps NICs per 8-GPU server = 50 GB/s per GPU.
    nic_bytes_per_s: float = 50e9
    # CHOICE: RDMA KV transfer (mooncake) reaches ~70% of line rate.
    nic_efficiency: float = 0.7

    @property
    def hbm_effective(self) -> float:
        return self.hbm_bytes_per_s * self.hbm_efficiency


H200 = GpuSpec()

# [LMSYS] 52.3k tok/s per 8 H100s = 6.54k tok/s per GPU for DeepSeek-V3 (37B active ->
# 74 GFLOP/token): ~484 TFLOPS of effective FP8 prefill compute per GPU. We reuse this
# measured efficiency for the other models' MoE/dense prefill cost (same GPU class).
PREFILL_FLOPS_PER_GPU = 2 * 37e9 * 52.3e3 / 8


@dataclass(frozen=True)
class ModelProfile:
    """One model's engine layout and cost functions (see module docstring for sources)."""

    name: str
    gpus_per_engine: int
    attn_dp: int
    attn_tp: int
    ep: int
    chunk_size: int
    kv_bytes_per_token: int
    """Bytes of KV cache one token occupies on its rank (all layers, all heads, summed over
    the rank's attention-TP GPUs)."""
    weight_gb_per_gpu: float
    active_params: float
    """Parameters touched per token (prefill FLOPs = 2 x active_params per token)."""
    prefill_fixed_s: float
    """Per-chunk overhead: kernel launches and the EP all-to-all of every MoE layer."""
    attn_flops_per_pair: float
    """Prefill attention FLOPs per (new token, context token) pair, all layers."""
    decode_comm_s: float
    """Per decode step: EP dispatch/combine latency across the engine (CHOICE per layout)."""
    decode_s_per_seq: float
    """Per sequence in the batch: sampling, per-request attention setup, top-k reads."""
    kv_read_bytes_per_token: int
    """KV bytes read per context token in one decode step (all layers)."""
    in_place_switch_s: float
    restart_switch_s: float
    layers: int = 61
    """Transformer layers ([HF]); sets the eager-launch cost of an extend step."""
    eager_launch_s_per_layer: float = 0.0002
    """CHOICE: CPU launch cost per layer of a decode step run without its CUDA graph (~25
    kernels x ~8 us each); paid by decoding ranks in an extend step [SGL-DPA]."""
    switch_modes: tuple[str, ...] = ("in_place", "restart")
    mem_fraction_static: float = 0.88
    """CHOICE: SGLang's --mem-fraction-static; the rest holds activations/CUDA graphs."""
    reserve_gb_per_gpu: float = 4.0
    """CHOICE: CUDA graphs, activation buffers and fragmentation inside the static pool."""
    transfer_latency_s: float = 0.002
    """CHOICE: per-request KV-transfer setup (bootstrap handshake) latency."""
    gpu: GpuSpec = field(default=H200)
    notes: str = ""

    # --- derived layout ---------------------------------------------------------------

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one attention DP rank (its attention tensor-parallel group)."""
        return self.gpus_per_engine // self.attn_dp

    @property
    def kv_capacity_per_rank(self) -> int:
        """KV tokens one attention DP rank holds: free static memory / bytes per token."""
        free = self.gpu.memory_gb * self.mem_fraction_static - self.weight_gb_per_gpu
        free -= self.reserve_gb_per_gpu
        return int(max(free, 0.0) * GB * self.gpus_per_rank / self.kv_bytes_per_token)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens of the whole engine (what ``engine.registered`` reports)."""
        return self.kv_capacity_per_rank * self.attn_dp

    @property
    def prefill_s_per_token(self) -> float:
        """Linear (GEMM) prefill cost per new token on one rank."""
        return 2 * self.active_params / (PREFILL_FLOPS_PER_GPU * self.gpus_per_rank)

    @property
    def decode_fixed_s(self) -> float:
        """Per decode step: read every weight on the GPU once (a large decode batch touches
        nearly every expert) at effective HBM bandwidth, plus the EP communication."""
        return self.weight_gb_per_gpu * GB / self.gpu.hbm_effective + self.decode_comm_s

    # --- cost functions -------------------------------------------------------------

    def prefill_time(self, new_tokens: int, context_tokens: int = 0) -> float:
        """Seconds for one rank to run one prefill forward of ``new_tokens`` new tokens
        whose attention sees ``context_tokens`` earlier tokens (cached prefix or earlier
        chunks). Linear GEMM cost + attention over (context + half the chunk) + overhead.
        A chunk never exceeds :attr:`chunk_size`; callers split longer prompts."""
        if new_tokens <= 0:
            return 0.0
        pairs = new_tokens * (context_tokens + new_tokens / 2.0)
        attn = pairs * self.attn_flops_per_pair / (PREFILL_FLOPS_PER_GPU * self.gpus_per_rank)
        return self.prefill_fixed_s + new_tokens * self.prefill_s_per_token + attn

    def decode_step_time(self, batch: int, kv_tokens: int, extend: bool = False) -> float:
        """Seconds for one rank to decode one token for each of ``batch`` sequences that
        together hold ``kv_tokens`` KV tokens (memory-bound: weights + KV reads).

        ``extend``: another attention-DP rank of the same engine runs a prefill in this
        step, so this rank decodes without its CUDA graph and with the normal-mode
        all-to-all ([SGL-DPA]): :attr:`extend_step_penalty_s` more."""
        if batch <= 0:
            return 0.0
        kv_read = kv_tokens * self.kv_read_bytes_per_token / (
            self.gpu.hbm_effective * self.gpus_per_rank
        )
        t = self.decode_fixed_s + batch * self.decode_s_per_seq + kv_read
        if extend:
            t += self.extend_step_penalty_s
        return t

    @property
    def extend_step_penalty_s(self) -> float:
        """Extra seconds of a decode step in an extend step ([SGL-DPA]): eager kernel launches
        of every layer, and the normal-mode all-to-all (``prefill_fixed_s``) in place of the
        low-latency one (``decode_comm_s``). Zero without attention DP: such an engine never
        mixes modes within a step."""
        if self.attn_dp <= 1:
            return 0.0
        return self.layers * self.eager_launch_s_per_layer + max(0.0, self.prefill_fixed_s - self.decode_comm_s)

    def engine_step_time(self, rank_times: list[float]) -> float:
        """One engine step: the slowest rank's time (every step ends in the MoE all-to-all,
        so the ranks run in lock-step). ``rank_times`` are per-rank times from
        :meth:`prefill_time` / :meth:`decode_step_time` (with ``extend`` set for decoding ranks
        when any rank prefills); ranks with no work contribute 0."""
        return max(rank_times, default=0.0)

    def kv_transfer_time(self, tokens: int) -> float:
        """Seconds to move ``tokens`` tokens of KV from a prefill rank to a decode rank over
        the rank's GPUs' RDMA NICs (SGLang PD transfers the full prompt's KV)."""
        bw = self.gpu.nic_bytes_per_s * self.gpu.nic_efficiency * self.gpus_per_rank
        return self.transfer_latency_s + tokens * self.kv_bytes_per_token / bw

    def switch_time(self, mode: str) -> float:
        """Seconds a role switch takes AFTER the engine drained: ``in_place`` or ``restart``."""
        if mode == "in_place":
            return self.in_place_switch_s
        if mode == "restart":
            return self.restart_switch_s
        raise ValueError(f"unknown switch mode {mode!r}; expected 'in_place' or 'restart'")

    def engines_in(self, total_gpus: int) -> int:
        """How many engines ``total_gpus`` GPUs hold."""
        return total_gpus // self.gpus_per_engine


# In-place switch: SGLang reports no public timing [SGL]. CHOICE: 15 s (tear down and
# rebuild the KV pool layout, recapture decode CUDA graphs; weights stay resident).
_IN_PLACE_S = 15.0

QWEN3_235B = ModelProfile(
    name="qwen3-235b",
    gpus_per_engine=4,  # [P] EP4
    attn_dp=2,  # [P] attention TP2 on a 4-GPU engine -> 2 attention DP ranks
    attn_tp=2,
    ep=4,
    chunk_size=4096,  # [P]
    # [HF] 2 (K,V) x 94 layers x 4 KV heads x 128 dims x 2 bytes (BF16 KV) = 192,512 B.
    kv_bytes_per_token=2 * 94 * 4 * 128 * 2,
    # [HF] experts 94 x 128 x 3 x 4096 x 1536 = 227B FP8 over EP4 = 56.8 GB, plus ~8B
    # attention/embedding split by attention TP2 = ~4 GB.
    weight_gb_per_gpu=61.0,
    active_params=22e9,  # [HF]
    prefill_fixed_s=0.015,  # CHOICE: ~0.16 ms x 94 layers (launch + intra-node a2a)
    # [HF] QK^T + PV: 2 x 2 x 64 heads x 128 dims per pair per layer x 94 layers.
    attn_flops_per_pair=4 * 64 * 128 * 94,
    decode_comm_s=0.003,  # CHOICE: NVLink all-to-all inside one server
    decode_s_per_seq=0.00005,  # CHOICE
    kv_read_bytes_per_token=2 * 94 * 4 * 128 * 2,  # full attention reads all KV
    layers=94,  # [HF]
    in_place_switch_s=_IN_PLACE_S,
    restart_switch_s=390.0,  # [SGL] ~6.5 min for Qwen3-235B FP8 on 4 GPUs
    notes="EP4, attention TP2: 4-GPU engines, 2 attention DP ranks",
)

DEEPSEEK_V32 = ModelProfile(
    name="deepseek-v3.2",
    gpus_per_engine=16,  # [P] EP16
    attn_dp=16,  # [P] attention DP16 (no attention TP)
    attn_tp=1,
    ep=16,
    chunk_size=512,  # [P]
    # [HF]+SGLang's FP8 MLA layout: 512 FP8 latent + 16 B scales + 64 BF16 rope = 656 B,
    # plus the V3.2 indexer key (128 FP8 + 4 B scale) = 132 B; x 61 layers.
    kv_bytes_per_token=(656 + 132) * 61,
    # [HF] routed experts 653B FP8 / EP16 = 40.8 GB + ~18B replicated (attention, shared
    # experts, embeddings) per DP rank.
    weight_gb_per_gpu=59.0,
    active_params=37e9,  # [HF]
    prefill_fixed_s=0.020,  # CHOICE: ~0.33 ms x 61 layers of DeepEP normal-mode a2a (2 nodes)
    # [HF] sparse attention: the indexer scores every context key (64 heads x 128 dims,
    # x2 FLOPs, 61 layers); the main attention over <= 2048 keys is folded into the
    # per-token cost (it is bounded).
    attn_flops_per_pair=2 * 64 * 128 * 61,
    # [DEEPEP] EP16 low-latency dispatch 118 us + combine 195 us per MoE layer x 58 MoE
    # layers [HF] = 18.2 ms (128 tokens per rank; no two-batch overlap assumed).
    decode_comm_s=58 * (118e-6 + 195e-6),
    # CHOICE, anchored: fixed ~39 ms + 0.1 ms x 128 seqs -> ~2.5k tok/s per GPU, against
    # [LMSYS]'s 22.3k output tok/s per 8-GPU node (2.8k per GPU, with two-batch overlap).
    decode_s_per_seq=0.0001,
    layers=61,  # [HF]
    kv_read_bytes_per_token=132 * 61,  # decode reads every indexer key, top-2048 latents
    in_place_switch_s=_IN_PLACE_S,
    restart_switch_s=480.0,  # CHOICE: 2.9x Qwen3's weights, loaded in parallel on 16 GPUs
    notes="EP16, attention DP16: 16-GPU engines (2 servers), 16 attention DP ranks",
)

MIMO_V25_PRO = ModelProfile(
    name="mimo-v2.5-pro",
    gpus_per_engine=16,  # [P] EP16
    attn_dp=2,  # [P] attention TP8 on a 16-GPU engine -> 2 attention DP ranks
    attn_tp=8,
    ep=16,
    chunk_size=4096,  # [P]
    # CHOICE: MiMo-V2.5-Pro's attention layout is not in our references. By analogy with
    # MiMo-V2-Flash (hybrid sliding-window/global attention) we assume ~160 KB of KV per
    # token for the global layers (sliding-window KV is bounded and ignored).
    kv_bytes_per_token=160_000,
    weight_gb_per_gpu=66.0,  # [P] "1T" FP8 over EP16 = ~62.5 GB + replicated attention
    active_params=42e9,  # CHOICE: ~4% active, like other 1T MoE models
    prefill_fixed_s=0.020,  # CHOICE: as DeepSeek (2-node EP16 a2a)
    attn_flops_per_pair=1.5e6,  # CHOICE: global layers only (hybrid attention)
    decode_comm_s=0.010,  # CHOICE: as DeepSeek (2-node EP16)
    decode_s_per_seq=0.00008,  # CHOICE
    kv_read_bytes_per_token=160_000,
    layers=70,  # CHOICE: not in our references (1T-class MoE models have 60-80 layers)
    in_place_switch_s=_IN_PLACE_S,
    restart_switch_s=600.0,  # CHOICE: ~1 TB of weights
    notes="EP16, attention TP8: 16-GPU engines, 2 attention DP ranks (least certain profile)",
)

PROFILES: dict[str, ModelProfile] = {
    p.name: p for p in (QWEN3_235B, DEEPSEEK_V32, MIMO_V25_PRO)
}
"""The paper's three setups by name."""

CLUSTER_GPUS = 128
"""[P] 16 servers x 8 GPUs."""

RESERVED_DECODE_TOKENS = 512
"""[SGL] A PD decode engine admits a transferred request (and resumes a retracted one)
only with this many KV tokens kept free for each request it holds, that one included
(``disaggregation/decode.py``: ``_allocatable_tokens``, ``num_reserved_decode_tokens``,
the environment's ``SGLANG_NUM_RESERVED_DECODE_TOKENS``, default 512)."""


def get_profile(name: str) -> ModelProfile:
    """Return the named profile, or raise ``ValueError`` listing the valid names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of: {', '.join(sorted(PROFILES))}"
        ) from None
