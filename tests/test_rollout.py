import pytest

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.generators import HFGenerator, SimulatedGenerator
from seal_rl.rollout import Budgets, DriverStats, Generation, run_episodes
from seal_rl.trajectory import ChatTokens


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


class Recording(HFGenerator):
    """Remembers every message it generated, per episode."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated: dict[int, list[list[int]]] = {}

    def generate(self, requests, seed):
        out = super().generate(requests, seed)
        for request, generation in zip(requests, out):
            self.generated.setdefault(request.episode, []).append(generation.token_ids)
        return out

    def step(self):
        ended = super().step()
        for episode, generation in ended:
            self.generated.setdefault(episode, []).append(generation.token_ids)
        return ended


@pytest.mark.parametrize("scheduler", ["continuous", "lockstep"])
@pytest.mark.parametrize("prompt_mode", ["bfcl_qwen_fc", "chat_template"])
def test_samples_are_token_exact_and_the_mask_covers_exactly_the_generated_tokens(tiny, task_set, prompt_mode, scheduler):
    model, tokenizer = tiny
    generator = Recording(model, tokenizer, temperature=1.0)
    chat = ChatTokens(tokenizer)
    tasks = [task_set.get("multi_turn_base_105"), task_set.get("multi_turn_miss_param_105")]
    budgets = Budgets(max_prompt_tokens=20000, max_completion_tokens=400, max_new_tokens=20)
    rollouts = run_episodes([(i, t, {}) for i, t in enumerate(tasks)], generator,
                            lambda: BfclEnv(EnvConfig(prompt_mode=prompt_mode)), chat=chat, budgets=budgets, scheduler=scheduler)  # fmt: skip
    assert generator.generated
    for rollout, task in zip(rollouts, tasks):
        trajectory = rollout.trajectory
        assert len(trajectory.completion_ids) == len(trajectory.env_mask) == len(trajectory.logprobs)
        masked_in = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if m]
        expected = [t for message in generator.generated[rollout.index] for t in message]
        assert masked_in == expected[: len(masked_in)] and len(masked_in) >= len(expected) - budgets.max_new_tokens
        # The sample decodes to the chat template's rendering of the whole conversation.
        chat.tools = BfclEnv(EnvConfig(prompt_mode=prompt_mode)).reset(task)[1]["tools"] if prompt_mode == "chat_template" else None
        rendered = chat.render(rollout.record["messages"], generation_prompt=False)
        decoded = tokenizer.decode(trajectory.ids)
        if rollout.record["end_reason"] == "completed":
            assert rendered.startswith(decoded) and rendered[len(decoded):] in ("<|im_end|>\n", "\n")
        assert len(trajectory.completion_ids) <= budgets.max_completion_tokens


def test_budgets_truncate_and_say_so(tiny, task_set):
    model, tokenizer = tiny
    task = task_set.get("multi_turn_base_105")
    (rollout,) = run_episodes([(0, task, {})], HFGenerator(model, tokenizer), lambda: BfclEnv(), chat=ChatTokens(tokenizer),
                              budgets=Budgets(max_prompt_tokens=100))  # fmt: skip
    assert rollout.record["end_reason"] == "prompt_budget" and rollout.record["model_calls"] == 0
    (rollout,) = run_episodes([(0, task, {})], HFGenerator(model, tokenizer), lambda: BfclEnv(), chat=ChatTokens(tokenizer),
                              budgets=Budgets(max_prompt_tokens=20000, max_completion_tokens=30, max_new_tokens=20))  # fmt: skip
    assert rollout.record["end_reason"] == "completion_budget"
    assert len(rollout.trajectory.completion_ids) <= 30


def test_same_seed_same_rollouts(tiny, task_set):
    model, tokenizer = tiny
    task = task_set.get("multi_turn_base_105")
    runs = []
    for _ in range(2):
        (rollout,) = run_episodes([(0, task, {})], HFGenerator(model, tokenizer, temperature=1.0), lambda: BfclEnv(),
                                  chat=ChatTokens(tokenizer), budgets=Budgets(max_prompt_tokens=20000, max_completion_tokens=200, max_new_tokens=16), seed=7)  # fmt: skip
        runs.append(rollout.trajectory.completion_ids)
    assert runs[0] == runs[1]


def test_concurrency_and_input_order(task_set):
    tasks = list(task_set)[:12]
    done = []
    stats = DriverStats()
    rollouts = run_episodes([(i, t, {"n": i}) for i, t in enumerate(tasks)], SimulatedGenerator(0.0), BfclEnv,
                            concurrency=5, on_done=lambda r: done.append(r.index), stats=stats)  # fmt: skip
    assert [r.index for r in rollouts] == list(range(12)) and sorted(done) == list(range(12))
    assert all(r.record["n"] == r.index and r.record["end_reason"] == "completed" for r in rollouts)
    steps = sum(t.num_turns for t in tasks)  # plain text ends every turn: one step per turn
    assert steps / 5 <= stats.ticks <= steps
    with pytest.raises(SealError, match="concurrency must be at least 1"):
        run_episodes([], SimulatedGenerator(0.0), BfclEnv, concurrency=0)


def test_a_generator_may_give_up():
    class Silent:
        def generate(self, requests, seed):
            return [None for _ in requests]

    from seal_rl.tasks import TaskSet

    task = TaskSet.load().get("multi_turn_base_0")
    (rollout,) = run_episodes([(0, task, {})], Silent(), BfclEnv)
    assert rollout.record["end_reason"] == "policy_exhausted"
    assert Generation("x").token_ids is None


class OutOfOrder:
    """A streaming generator: the oracle's answers, each after a random delay, so episodes finish
    in an order that has nothing to do with their input order."""

    def __init__(self, agents, fail_episode=None):
        import random
        from concurrent.futures import ThreadPoolExecutor

        self.agents, self.fail_episode = agents, fail_episode
        self.pool = ThreadPoolExecutor(8)
        self.rng = random.Random(3)

    def _answer(self, request, delay):
        import time

        time.sleep(delay)
        if request.episode == self.fail_episode:
            raise ConnectionError("the server vanished")
        text = self.agents[request.episode].act(request.observation, request.info)
        return None if text is None else Generation(text)

    def submit(self, request, seed):
        return self.pool.submit(self._answer, request, self.rng.random() * 0.01)

    def generate(self, requests, seed):  # pragma: no cover - the driver must stream
        raise AssertionError("a streaming generator is not ticked")


def _oracle_agents(tasks, faults):
    from seal_rl.policies import OraclePolicy

    episodes = OraclePolicy(faults=faults, seed=5).episodes(tasks, None, "hermes")
    return {i: episode.agent for i, episode in enumerate(episodes)}


def test_streaming_driver_gives_the_records_of_lockstep_ticks(task_set):
    from seal_rl.generators import ScriptedGenerator

    tasks = [t for t in task_set if t.id.endswith(("_3", "_77", "_150"))]
    episodes = [(i, t, {}) for i, t in enumerate(tasks)]
    ticked = run_episodes(episodes, ScriptedGenerator(_oracle_agents(tasks, 0.4)), BfclEnv, concurrency=4)
    done = []
    streamed = run_episodes(episodes, OutOfOrder(_oracle_agents(tasks, 0.4)), BfclEnv, concurrency=4,
                            on_done=lambda r: done.append(r.index))  # fmt: skip
    assert [r.record for r in streamed] == [r.record for r in ticked]
    assert sorted(done) == list(range(len(tasks)))
    assert {r.record["reward"] for r in streamed} == {0.0, 1.0}  # the faults bite somewhere


def test_a_failing_streaming_request_ends_only_its_own_episode(task_set):
    tasks = [task_set.get(f"multi_turn_base_{i}") for i in range(4)]
    rollouts = run_episodes([(i, t, {}) for i, t in enumerate(tasks)], OutOfOrder(_oracle_agents(tasks, 0.0), fail_episode=2),
                            BfclEnv, concurrency=2)  # fmt: skip
    assert [r.record["end_reason"] for r in rollouts] == ["completed", "completed", "generation_error", "completed"]
    assert "ConnectionError: the server vanished" in rollouts[2].record["error"]
    assert [r.record["reward"] for r in rollouts] == [1.0, 1.0, 0.0, 1.0]
