"""Data: the MQAR task, text and prepared token files, and the Grain pipelines over them.

``make_dataset(data_config, seed, split)`` gives this process's batches as a grain.MapDataset;
``make_iterator`` turns it into a checkpointable, prefetching iterator. Every batch is a dict of
numpy arrays {inputs, targets, loss_mask[, segment_ids]}, [local_batch, seq_len].
"""

from .errors import DataError
from .mqar import mqar_example
from .pipeline import MQARSource, TokenWindowSource, make_dataset, make_iterator, make_source
from .prepare import load_token_file, prepare
from .text import tokenize_files
from .tokenizer import TokenizerError, load_gpt2_tokenizer

__all__ = ["DataError", "MQARSource", "TokenWindowSource", "TokenizerError", "load_gpt2_tokenizer",
           "load_token_file", "make_dataset", "make_iterator", "make_source", "mqar_example",
           "prepare", "tokenize_files"]
