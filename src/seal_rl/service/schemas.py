"""Request and response bodies of the environment service (they are its OpenAPI schema).

Split by direction, as in the FastAPI template: ``…Create``/``…Request`` come in, ``…Public``/
``…Response`` go out; internal state (workers, timers) never appears here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CallFormat = Literal["hermes", "pythonic", "json"]
PromptMode = Literal["bfcl_qwen_fc", "chat_template"]
Preset = Literal["vanilla", "paper", "seal"]
Guideline = Literal["cautious_call", "active_respond", "state_aware", "scope", "format"]
Category = Literal["base", "miss_func", "miss_param", "long_context"]
Split = Literal["train", "test", "all"]

EPISODE_ID = r"^[A-Za-z0-9_-]{8,64}$"


class Problem(BaseModel):
    """Every 4xx answer: what was wrong and what to do."""

    detail: str


class Health(BaseModel):
    """``ok`` (HTTP 200): every worker is up; ``degraded``: some are missing, ``unavailable``: none is
    (both HTTP 503; missing workers are being restarted)."""

    status: Literal["ok", "degraded", "unavailable"]
    version: str
    family: str = Field("bfcl", description="the environment family whose episodes are served (docs/guides/your-environment.md)")
    bfcl_eval: str
    workers: int
    workers_alive: int
    worker_restarts: int = Field(description="worker processes replaced since start (crashed or stuck)")
    worker_start_failures: int = Field(description="attempts to start a worker process that failed (each is retried with backoff)")
    live_episodes: int
    max_episodes: int


class TaskPublic(BaseModel):
    id: str
    category: str = Field(description="BFCL's base, miss_func, miss_param or long_context; another family's own categories")
    split: Literal["train", "test"]
    num_turns: int


class TaskList(BaseModel):
    tasks: list[TaskPublic]


class InterfaceStateModel(BaseModel):
    """An explicit Ω state (``seal_rl.interface.InterfaceState``); fields left out keep their defaults."""

    model_config = ConfigDict(extra="forbid")

    preset: Preset = "vanilla"
    schema_tools: list[str] = Field(default_factory=list, max_length=256, description='tools annotated by φ_schema; ["*"] for all')
    schema_types: bool = False
    format_note: bool = False
    parse_hints: bool = False
    tool_hints: bool = False
    guidelines: list[Guideline] = Field(default_factory=list, max_length=5)
    tool_list: bool = False
    pressure: list[str] = Field(default_factory=list, max_length=64)
    round: int = Field(0, ge=0)


EPISODE_CAPS = ("max_model_calls", "max_steps_per_turn", "max_message_chars", "max_calls_per_message", "max_result_chars",
                "observation_budget_chars")  # fmt: skip
"""the caps an episode request may set, each up to the service's ``<cap>_limit``"""


class EpisodeCreate(BaseModel):
    """Open an episode of a task of the served family (BFCL multi-turn by default)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(..., max_length=100, examples=["multi_turn_base_0"])
    episode_id: str | None = Field(
        None, pattern=EPISODE_ID,
        description="choose the id yourself to make creation safe to retry: the same request again returns the same episode",
    )  # fmt: skip
    protocol: Literal["seal", "bfcl"] = Field(
        "seal", description="seal: the released SEAL code's loop (training); bfcl: the official bfcl generate loop"
    )
    call_format: CallFormat = "hermes"
    prompt_mode: PromptMode = "bfcl_qwen_fc"
    interface: Preset | InterfaceStateModel = Field(
        "vanilla", description="a preset's initial state (vanilla | paper | seal) or an explicit Ω state"
    )
    mode: Literal["train", "eval"] = Field(
        "eval", description="eval renders the base interface whatever the state (strict protocol); train shows Ω"
    )
    max_model_calls: int = Field(20, ge=1, description="seal protocol: model messages before the episode is truncated (reference: 20)")
    max_steps_per_turn: int = Field(20, ge=1, description="bfcl protocol: executing steps per user turn before force-termination")
    max_message_chars: int = Field(100_000, ge=1, description="longer messages are rejected unparsed")
    max_calls_per_message: int = Field(64, ge=1, description="a message with more calls is rejected whole")
    max_result_chars: int = Field(50_000, ge=1, description="a tool output longer than this is cut, saying how much was cut")
    observation_budget_chars: int = Field(1_000_000, ge=1, description="tool output per episode; the episode ends when it runs out")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class EpisodePublic(BaseModel):
    episode_id: str
    task_id: str
    observation: list[ChatMessage] = Field(description="the opening messages: system block (bfcl_qwen_fc) and first question")
    tools: list[dict[str, Any]] = Field(description="OpenAI-style specs of the tools available now")
    turn: int
    num_turns: int
    interface: InterfaceStateModel
    active_components: list[str]


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(..., description="one raw assistant message in the episode's call format")
    step: int | None = Field(
        None, ge=0,
        description="the 0-based index of this message in the episode; with it a retried step is answered "
        "from the first attempt instead of being played twice",
    )  # fmt: skip


class StepInfo(BaseModel):
    turn: int
    step: int
    event: Literal["tool_results", "rejected", "next_turn", "user_reply", "end"] = Field(
        description="user_reply: a family's user answered the agent's text (docs/guides/your-environment.md)")
    tools: list[dict[str, Any]] | None = Field(None, description="present when the available tools changed")
    end_reason: str | None = None


class StepResponse(BaseModel):
    observation: list[ChatMessage]
    reward: float = Field(description="0 until the episode ends, then the verifier's reward")
    terminated: bool
    truncated: bool
    done: bool
    info: StepInfo


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        "client_stop", pattern=r"^[a-z_]{1,40}$",
        description="end reason recorded if the episode is still running (e.g. your token budget ran out)",
    )  # fmt: skip
    include_record: bool = Field(False, description="also return the whole episode record (transcript, trace, verdict)")


class TurnLabelPublic(BaseModel):
    turn: int
    label: str
    evidence: dict[str, Any]


class Evaluation(BaseModel):
    """The verifier's reward and Ψ's per-turn labels with evidence (docs/concepts/diagnosis.md)."""

    episode_id: str
    task_id: str
    reward: float
    end_reason: str
    turns_reached: int
    num_turns: int
    model_calls: int
    labels: list[TurnLabelPublic]
    progress: float
    progress_with_abstentions: float
    verdict: dict[str, Any]
    record: dict[str, Any] | None = None


class Released(BaseModel):
    episode_id: str
    released: bool
