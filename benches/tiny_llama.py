#!/usr/bin/env python3
"""Builds a small randomly initialised Llama and a byte-level BPE tokenizer trained here, so that
`transformers serve` can run a real engine with no model hub (nothing is downloaded).

Random weights emit random tokens: with a byte-level BPE vocabulary many of them are partial
UTF-8 sequences, which the engine holds back until they form valid text. That is the case that
made speed look 2.5x too high (issue "Real engines", item 2), kept on purpose.

Usage: benches/tiny_llama.py OUT_DIR [HIDDEN=256] [LAYERS=4] [DEVICE=cpu]
On a GPU (DEVICE=cuda) the weights are drawn there and saved in bfloat16: a 1B model drawn on
the CPU in float32 takes a minute of a lent machine's time.
"""
import random
import sys

import torch

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def corpus(n=20000, seed=1):
    """Random words (so that most of the vocabulary is merged ASCII text, which streams as it
    comes) with some emoji and CJK (whose bytes are held back until they form characters)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    extra = ["über", "naïve", "日本語", "テキスト", "🙂", "🚀"]
    for _ in range(n):
        words = ("".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
                 if rng.random() < 0.97 else rng.choice(extra) for _ in range(rng.randint(4, 24)))
        yield " ".join(words)


def main():
    out = sys.argv[1]
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin|>",
                                   eos_token="<|end|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64), max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    with torch.device(device):
        model = LlamaForCausalLM(config)
    if device != "cpu":
        model = model.to(torch.bfloat16)
    # A random model that never says its end token: every request runs to max_tokens. Nor any
    # other special token: an engine strips those from the text, and a large vocabulary's few
    # specials would otherwise be chunks without content.
    model.generation_config.eos_token_id = None
    model.generation_config.suppress_tokens = [fast.convert_tokens_to_ids(t) for t in specials]
    model.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"vocabulary {len(fast)}")


if __name__ == "__main__":
    main()
