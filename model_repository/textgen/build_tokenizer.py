"""Writes textgen's tokenizer folder, `tokenizer/`, a Hugging Face tokenizer of its
vocabulary (one token per character) with a chat template, so that the OpenAI chat route can
turn messages into a prompt offline. Committed; run this after changing the vocabulary or the
template (needs the `tokenizers` package):

    .venv/bin/python model_repository/textgen/build_tokenizer.py

textgen_iterative/tokenizer is a link to this folder.
"""

import json
import os

from tokenizers import Tokenizer, decoders, models

HERE = os.path.dirname(os.path.abspath(__file__))

# transformer.py's VOCAB: newline, then printable ASCII. Other characters are unknown ("?",
# as the model reads them).
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))

# "Role: content" a line, then "Assistant:" for the model to continue: the corpus is prose,
# so the template keeps to plain text.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] -%}"
    "{%- if content is not string -%}"
    "{%- set content = (content or []) | map(attribute='text') | join('') -%}"
    "{%- endif -%}"
    "{{ message['role'] | capitalize }}: {{ content }}{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)


def main() -> None:
    folder = os.path.join(HERE, "tokenizer")
    os.makedirs(folder, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(VOCAB)}, merges=[],
                                     unk_token="?"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 256,
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
