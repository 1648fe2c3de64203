"""The step-time model of a hardware profile: a roofline of the step's work, with the same
interface as the fitted CostModel (predict, predict_counts, scaled, kv_blocks, block_size,
tile_tokens, model/dtype/device), so the simulator, the warm start and the deadline policy price
steps on a GPU we cannot run exactly as they do with a calibration of this machine.

    t = step overhead + sequences x sequence overhead
        + linear layers: ((W/B)^p + (F(rows)/C)^p)^(1/p) + layers x layer overhead
            W weight bytes per GPU, B achieved bandwidth; F FLOPs of the step's rows (tokens rounded
            up to the GEMM tile past the first tile, so 136 tokens cost like 256), C achieved compute;
            p the roofline knee (large p: the plain max, small p: memory and math overlap poorly)
        + LM head: the same roofline over the sampled rows
        + KV read: context tokens x KV bytes per token / achieved bandwidth
        + attention arithmetic: attended pairs x 4 x heads x head_dim x layers / achieved compute
        + TP all-reduce: 2 per layer x (latency + tokens x hidden x 2 bytes / bandwidth)

The per-token terms depend only on the step's token and sampled-row counts, so they are cached:
`predict_counts` is a few dict lookups and plain float arithmetic (the simulator's hot path).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simulation.cost_model import CostModel, StepShape
from simulation.hardware_profile import HardwareProfile, load_profile

PLAIN_MAX_KNEE = 50.0       # from here on (m^p + c^p)^(1/p) is max(m, c) to within 1.4%


@dataclass(frozen=True)
class StepTerms:
    """A profile's roofline at one TP degree, as seconds per unit of work."""

    weights_s: float            # streaming one step's linear-layer weights
    row_s: float                # the linear layers' arithmetic per row (token), at the achieved rate
    head_weights_s: float
    head_row_s: float
    knee: float
    tile: int
    layers_s: float             # layers x per-layer overhead
    allreduce_s: float          # fixed part of a step's all-reduces
    allreduce_token_s: float    # per token in the step
    kv_token_s: float           # reading one cached token's K and V
    pair_s: float               # attention arithmetic of one (query, key) pair
    step_s: float
    sequence_s: float

    @staticmethod
    def of(profile: HardwareProfile, tp: int) -> StepTerms:
        hw, m, o = profile.hardware, profile.model, profile.overheads
        s = m.shape
        bandwidth = hw.hbm_tbs * 1e12 * hw.weight_bandwidth_fraction
        compute = hw.peak_tflops * 1e12 * hw.compute_fraction
        linear_params = s.linear_params / tp
        head_params = s.head_params / tp
        if tp > 1:
            ar = hw.allreduce_for(tp)
            allreduce_s, allreduce_token_s = (2 * s.num_layers * ar.latency_us * 1e-6,
                                              2 * s.num_layers * s.hidden_size * m.bytes_per_param
                                              / (ar.bandwidth_gbs * 1e9))
        else:
            allreduce_s = allreduce_token_s = 0.0
        return StepTerms(
            weights_s=linear_params * m.bytes_per_param / bandwidth,
            row_s=2 * linear_params / compute,
            head_weights_s=head_params * m.bytes_per_param / bandwidth,
            head_row_s=2 * head_params / compute,
            knee=hw.roofline_knee,
            tile=hw.gemm_tile_tokens,
            layers_s=s.num_layers * hw.layer_overhead_us * 1e-6,
            allreduce_s=allreduce_s,
            allreduce_token_s=allreduce_token_s,
            kv_token_s=m.kv_bytes_per_token(tp) / (hw.hbm_tbs * 1e12 * hw.attention_bandwidth_fraction),
            pair_s=s.attention_flops_per_pair(tp) / (hw.peak_tflops * 1e12 * hw.attention_compute_fraction),
            step_s=o.step_us * 1e-6,
            sequence_s=o.sequence_us * 1e-6,
        )

    def rows(self, tokens: int) -> int:
        """GEMM rows computed: small batches run as they are, larger ones in whole tiles."""
        return tokens if tokens <= self.tile else -(-tokens // self.tile) * self.tile

    def roofline(self, weights_s: float, compute_s: float) -> float:
        if self.knee >= PLAIN_MAX_KNEE:
            return max(weights_s, compute_s)
        p = self.knee
        return (weights_s ** p + compute_s ** p) ** (1.0 / p)

    def linear_s(self, tokens: int) -> float:
        """The linear layers of a step of `tokens` tokens (LM head and communication excluded)."""
        if tokens <= 0:
            return 0.0
        return self.roofline(self.weights_s, self.row_s * self.rows(tokens)) + self.layers_s

    def head_s(self, sampled: int) -> float:
        if sampled <= 0:
            return 0.0
        return self.roofline(self.head_weights_s, self.head_row_s * self.rows(sampled))

    def communication_s(self, tokens: int) -> float:
        return self.allreduce_s + self.allreduce_token_s * tokens if tokens > 0 else 0.0


@dataclass(frozen=True)
class ProfileCostModel:
    profile: HardwareProfile
    tp: int = 0                          # 0: the profile's own degree
    speed: float = 1.0                   # every prediction times this (scaled())
    notes: dict[str, str] = field(default_factory=dict)
    fit_mape: float | None = None        # the CostModel fields a report may read: not fitted
    holdout_mape: float | None = None
    num_samples: int = 0
    step_scatter: tuple[float, ...] = ()  # live scatter around the predictions (CostModel.step_scatter)
    grammar_row_s: float = 0.0           # seconds per sampled row held to a grammar (CostModel.grammar_row_s)
    terms: StepTerms = field(init=False, repr=False, compare=False)
    _by_tokens: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_sampled: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tp:
            object.__setattr__(self, "tp", self.profile.tp)
        if not self.speed > 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        object.__setattr__(self, "terms", StepTerms.of(self.profile, self.tp))

    @staticmethod
    def named(name: str) -> ProfileCostModel:
        """The step-time model of a shipped profile (configs/hardware_profiles/NAME.yaml)."""
        return ProfileCostModel(load_profile(name))

    # -- what the simulator and policies read of a cost model --
    @property
    def model(self) -> str:
        return self.profile.model.name

    @property
    def dtype(self) -> str:
        return self.profile.model.dtype

    @property
    def device(self) -> str:
        return f"{self.profile.hardware.name} x{self.tp}"

    @property
    def kv_blocks(self) -> int:
        return self.profile.kv_blocks(self.tp)

    @property
    def block_size(self) -> int:
        return self.profile.block_size

    @property
    def tile_tokens(self) -> int:
        return self.profile.hardware.gemm_tile_tokens

    def predict(self, shape: StepShape) -> float:
        return self.predict_counts(shape.num_prefill_tokens, shape.num_decode_tokens, shape.num_sampled,
                                   shape.context_tokens, shape.attended_pairs, shape.num_seqs) \
            + self.grammar_row_s * shape.grammar_rows

    def predict_counts(self, prefill: int, decode: int, sampled: int, context: int, pairs: int, seqs: int) -> float:
        tokens = prefill + decode
        by_tokens = self._by_tokens.get(tokens)
        if by_tokens is None:
            by_tokens = self._by_tokens[tokens] = self.terms.linear_s(tokens) + self.terms.communication_s(tokens)
        head = self._by_sampled.get(sampled)
        if head is None:
            head = self._by_sampled[sampled] = self.terms.head_s(sampled)
        t = self.terms
        return self.speed * (t.step_s + t.sequence_s * seqs + by_tokens + head + t.kv_token_s * context
                             + t.pair_s * pairs)

    def scaled(self, factor: float) -> ProfileCostModel:
        """Every prediction times `factor` (what LiveCostModel does to a calibration)."""
        return replace(self, speed=self.speed * factor, notes=self.notes | {"speed_factor": f"{factor:.3f}"})

    def at_tp(self, tp: int) -> ProfileCostModel:
        """The same GPU and calibration at another tensor-parallel degree."""
        return replace(self, tp=tp)


StepTimeModel = CostModel | ProfileCostModel     # what the simulator, warm start and policies price steps with
