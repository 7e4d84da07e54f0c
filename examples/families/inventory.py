"""A whole environment family in one file: a warehouse with shelves, a user, and a verifier.

Train SEAL on it (docs/guides/your-environment.md):

    seal train --config smoke-cpu --set family=examples/families/inventory.py:Inventory

The agent moves stock between shelves, restocks and answers stock questions with four tools.
Some requests leave out the source shelf: the user names it when asked (``reply``). The verifier
compares the final shelves with the expected ones and, for questions, looks for the number in
the agent's last answer; it names what differs, which is what Ψ labels failures with.
"""

from __future__ import annotations

import copy
import random
import re

from seal_rl.environments import Family, FamilyTask, Outcome, ToolError
from seal_rl.tools import ToolCall

ITEMS = ("apples", "bolts", "cables", "drills", "gloves", "hammers")
SHELVES = ("A", "B", "C")


def _tool(name: str, description: str, **params: tuple[str, str]) -> dict:
    """A JSON-schema function doc; every parameter is required."""
    properties = {p: {"type": kind, "description": text} for p, (kind, text) in params.items()}
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)}}


TOOLS = [
    _tool("list_items", "List every shelf and the stock of each item on it."),
    _tool("get_stock", "Units of an item on a shelf.", item=("string", "item name"), shelf=("string", "shelf letter")),
    _tool("move", "Move units of an item from one shelf to another.", item=("string", "item name"),
          source=("string", "shelf to take from"), target=("string", "shelf to put on"),
          quantity=("integer", "units to move, at least 1")),
    _tool("set_stock", "Set the units of an item on a shelf (restocking).", item=("string", "item name"),
          shelf=("string", "shelf letter"), quantity=("integer", "new number of units, 0 or more")),
]


def _shelves(seed: int) -> dict[str, dict[str, int]]:
    rng = random.Random(seed)
    return {s: {i: rng.randint(0, 9) for i in rng.sample(ITEMS, 3)} for s in SHELVES}


def _make_task(n: int, split: str) -> FamilyTask:
    rng, shelves = random.Random(n), _shelves(n)
    kind = ("move", "ask_source", "restock", "query")[n % 4]
    source = rng.choice([s for s in SHELVES if any(shelves[s].values())])
    item = rng.choice([i for i, q in shelves[source].items() if q])
    target = rng.choice([s for s in SHELVES if s != source])
    quantity = rng.randint(1, shelves[source][item])
    prompts = {
        "move": f"Please move {quantity} {item} from shelf {source} to shelf {target}.",
        "ask_source": f"Please move {quantity} {item} to shelf {target}.",
        "restock": f"Restock shelf {target}: it should hold exactly {quantity + 5} {item}.",
        "query": f"How many {item} are on shelf {source}?",
    }
    data = {"shelves": shelves, "kind": kind, "item": item, "source": source, "target": target, "quantity": quantity}
    return FamilyTask(f"inventory_{n}", kind, prompts[kind], split, data)


class Inventory(Family):
    name = "inventory"
    inspect_tools = ("list_items", "get_stock")

    def __init__(self, tasks: int = 40) -> None:
        self._tasks = [_make_task(n, "train" if n % 5 else "test") for n in range(tasks)]

    def tasks(self) -> list[FamilyTask]:
        return self._tasks

    def tools(self, task: FamilyTask) -> list[dict]:
        return TOOLS

    def instructions(self, task: FamilyTask) -> str:
        return "You are a warehouse assistant. Use the tools to do what the user asks, then answer briefly."

    def start(self, task: FamilyTask) -> dict:
        return {"shelves": copy.deepcopy(task.data["shelves"]), "asked": False}

    def call(self, state: dict, name: str, arguments: dict) -> str:
        shelves = state["shelves"]
        if name == "list_items":
            return "; ".join(f"{s}: " + ", ".join(f"{i} {q}" for i, q in sorted(items.items())) for s, items in shelves.items())
        for key in ("shelf", "source", "target"):
            if key in arguments and arguments[key] not in shelves:
                raise ToolError(f"no shelf {arguments[key]!r}; shelves are {', '.join(SHELVES)}")
        item, quantity = arguments["item"], arguments.get("quantity", 0)
        if name == "get_stock":
            return str(shelves[arguments["shelf"]].get(item, 0))
        if quantity < 0 or (name == "move" and quantity < 1):
            raise ToolError(f"quantity {quantity} is not allowed")
        if name == "set_stock":
            shelves[arguments["shelf"]][item] = quantity
            return f"shelf {arguments['shelf']} now holds {quantity} {item}"
        have = shelves[arguments["source"]].get(item, 0)
        if have < quantity:
            raise ToolError(f"shelf {arguments['source']} holds only {have} {item}")
        shelves[arguments["source"]][item] = have - quantity
        shelves[arguments["target"]][item] = shelves[arguments["target"]].get(item, 0) + quantity
        return f"moved {quantity} {item} from {arguments['source']} to {arguments['target']}"

    def reply(self, state: dict, task: FamilyTask, text: str) -> str | None:
        """The user names the source shelf once, when asked which shelf; anything else ends the chat."""
        if task.data["kind"] == "ask_source" and not state["asked"] and "shelf" in text.lower() and "?" in text:
            state["asked"] = True
            return f"From shelf {task.data['source']}."
        return None

    def oracle(self, task: FamilyTask) -> list:
        """The messages that solve the task (a warm start's transcripts)."""
        d = task.data
        move = [ToolCall("move", {k: d[k] for k in ("item", "source", "target", "quantity")})]
        return {"move": [move, "Done."], "ask_source": ["Which shelf should I take them from?", move, "Done."],
                "restock": [[ToolCall("set_stock", {"item": d["item"], "shelf": d["target"], "quantity": d["quantity"] + 5})], "Done."],
                "query": [[ToolCall("get_stock", {"item": d["item"], "shelf": d["source"]})],
                          f"There are {d['shelves'][d['source']][d['item']]} {d['item']} on shelf {d['source']}."]}[d["kind"]]

    def verify(self, task: FamilyTask, state: dict, transcript: list[dict]) -> Outcome:
        d, expected = task.data, copy.deepcopy(task.data["shelves"])
        if d["kind"] in ("move", "ask_source"):
            expected[d["source"]][d["item"]] -= d["quantity"]
            expected[d["target"]][d["item"]] = expected[d["target"]].get(d["item"], 0) + d["quantity"]
        elif d["kind"] == "restock":
            expected[d["target"]][d["item"]] = d["quantity"] + 5
        final = state["shelves"] if state else expected
        differs = tuple(sorted(f"{s}.{i}" for s in SHELVES for i in set(final[s]) | set(expected[s])
                               if final[s].get(i, 0) != expected[s].get(i, 0)))  # fmt: skip
        response_ok, missing = True, ()
        if d["kind"] == "query":
            answers = [m["content"] for m in transcript if m["role"] == "assistant" and m.get("content")]
            number = str(d["shelves"][d["source"]][d["item"]])
            response_ok = bool(answers) and re.search(rf"\b{number}\b", answers[-1]) is not None
            missing = () if response_ok else (number,)
        expected_tools = {"move": ("move",), "ask_source": ("move",), "restock": ("set_stock",), "query": ("get_stock",)}
        reward = float(not differs and response_ok)
        return Outcome(reward, state_ok=not differs, state_differences=differs, response_ok=response_ok,
                       missing_responses=missing, expected_tools=expected_tools[d["kind"]], evidence={"kind": d["kind"]})
