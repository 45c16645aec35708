"""G1's validity count reads every dialect's whole-reply form, and refuses what is not a clean call."""

import json

from bench.grammar import count_valid, g1_tools
from grammar.dialects import HERMES, LLAMA3_JSON, MISTRAL

TOOLS = g1_tools()


def _args() -> tuple[str, dict]:
    fn = TOOLS[0]["function"]
    required = fn["parameters"].get("required", [])
    props = fn["parameters"]["properties"]
    sample = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    args = {}
    for k in required:
        spec = props[k]
        args[k] = spec["enum"][0] if "enum" in spec else sample[spec.get("type", "string")]
    return fn["name"], args


def test_each_dialect_counts_clean_calls_and_refuses_noise():
    name, args = _args()
    hermes = f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
    assert count_valid([hermes, hermes + "\n" + hermes + "<|im_end|>"], TOOLS, HERMES) == 2
    assert count_valid(["hi " + hermes, hermes + " trailing", "<tool_call>\n{}"], TOOLS, HERMES) == 0
    mistral = "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": args}] * 2)
    assert count_valid([mistral + "</s>"], TOOLS, MISTRAL, eos=("</s>",)) == 1
    assert count_valid([mistral[:-1], "[TOOL_CALLS]{}"], TOOLS, MISTRAL) == 0
    one = json.dumps({"name": name, "parameters": args})
    assert count_valid([one, one + "; " + one], TOOLS, LLAMA3_JSON) == 2
    assert count_valid([one + ";", json.dumps({"name": name, "arguments": args})], TOOLS, LLAMA3_JSON) == 0
    assert args, "the first G1 tool has required arguments"
    missing = f"<tool_call>\n{json.dumps({'name': name, 'arguments': {}})}\n</tool_call>"
    unknown = f"<tool_call>\n{json.dumps({'name': 'no_such_tool', 'arguments': args})}\n</tool_call>"
    assert count_valid([missing, unknown], TOOLS, HERMES) == 0
