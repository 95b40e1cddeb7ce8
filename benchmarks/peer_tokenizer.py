"""A small byte-level BPE tokenizer in Hugging Face's format, trained on local text (no
download): what AIPerf needs to build and count prompts without reaching the Hub
(`benchmarks/streams.py` under PEERS=1 runs it with the peers' own Python).

Usage: PYTHON peer_tokenizer.py OUT_DIR TEXT_FILE
"""
import sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import PreTrainedTokenizerFast

out = Path(sys.argv[1])
text = Path(sys.argv[2]).read_text().splitlines()
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text * 4, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
fast.save_pretrained(out)
print("saved", out, len(fast))
