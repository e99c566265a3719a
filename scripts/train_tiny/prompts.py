"""Fixed prompts and tokenizer cases for the reference fixtures.

Kept in their own module so the fixture script and any later re-run use
exactly the same strings. Every string is written out here (nothing is read
from the machine) so the fixtures do not depend on which Python is installed.
"""

# About 200 tokens of hand-written Python for the "long" prompt.
LONG_CODE = '''import json
import os
from dataclasses import dataclass, field


@dataclass
class Record:
    """One row of the inventory file."""

    name: str
    count: int = 0
    tags: list = field(default_factory=list)

    def to_dict(self):
        return {"name": self.name, "count": self.count, "tags": list(self.tags)}


def load_records(path):
    """Read records from a JSON file, skipping entries without a name."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    with open(path, "r", encoding="utf-8") as f:
        data = json.load(f)
    records = []
    for item in data:
        if not item.get("name"):
            continue
        records.append(Record(item["name"], int(item.get("count", 0))))
    return records


def total_count(records):
'''

SYSTEM = "You are a helpful assistant."

PROMPTS = [
    {"name": "code_def", "kind": "code",
     "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n'},
    {"name": "code_class", "kind": "code",
     "text": "import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = "},
    {"name": "prose", "kind": "prose",
     "text": "The quick brown fox jumps over the lazy dog. This module provides a simple way to"},
    # 'nai\u0308ve' has a combining diaeresis that the NFC normalizer composes.
    {"name": "unicode", "kind": "prose",
     "text": "Caf\u00e9 nai\u0308ve \u2014 \u6771\u4eac \U0001F600 12345 and   spaces\n\n\ttabs, it's I'LL"},
    {"name": "very_short", "kind": "short", "text": "def"},
    {"name": "long_code", "kind": "code", "text": LONG_CODE},
    {"name": "chat", "kind": "chat",
     "messages": [{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "Write a function that reverses a list."}],
     "template_kwargs": {"add_generation_prompt": True}},
    {"name": "chat_multiturn_no_think", "kind": "chat",
     "messages": [{"role": "user", "content": "What does os.path.join do?"},
                  {"role": "assistant",
                   "content": "<think>\nThe user asks about a function.\n</think>\n\nIt joins path parts."},
                  {"role": "user", "content": "Show an example."}],
     "template_kwargs": {"add_generation_prompt": True, "enable_thinking": False}},
]

# Extra strings for tokenizer-only checks (ids, decode round trip).
TOKENIZER_CASES = [
    "", " ", "  ", "hello world", "Hello  World", "   leading spaces", "trailing   ",
    "\n", "\n\n\n", "a\r\nb", "line one\n\n  line two\n",
    "it's they'RE WE'VE I'm you'll he'd SHE'S", "don't stop", "1234567890", "3.14159e-10",
    "x=1+2*3", "    return self._cache[key]", "\t\tdef f():\n\t\t\tpass",
    "<|im_start|>user\nhi<|im_end|>\n", "<think>\nok\n</think>", "<tool_call>\n{}\n</tool_call>",
    "<|endoftext|><|endoftext|>", "text<|im_end|>more", "<|im_start|", "naïve café", "nai\u0308ve",
    "東京タワー", "😀👍🏽", "ÄÖÜ äöü ß", "Ω≈ç√∫", "    \n    \n", "a  \n  b", "__init__(self)",
    "https://example.com/path?q=1&r=2", "# comment\n# another", "'''docstring'''",
]
