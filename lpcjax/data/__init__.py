"""Data: registered data kinds (``data.kind``: MQAR, text files, prepared token files,
time-series classification files, generated series, and any a family adds) and the Grain
pipelines over them.

``make_dataset(data_config, seed, split)`` gives this process's batches as a grain.MapDataset;
``make_iterator`` turns it into a checkpointable, prefetching iterator. A batch is a dict of
numpy arrays with a leading [local_batch] axis; the language-model kinds give {inputs, targets,
loss_mask[, segment_ids]} of [local_batch, seq_len], ``series`` gives {x [local_batch, seq_len,
channels] (NaN where missing), label [local_batch]}; evaluation batches add ``valid``.
"""

from lpcjax.lazy import lazy_exports

from .errors import DataError
from .generated import GeneratedConfig, GeneratedSource
from .mqar import MQARDataConfig, MQARSource, mqar_example
from .recall_tasks import (TASK_KINDS, DelayedIdConfig, FuzzyRecallConfig, NoisyRecallConfig, OverwriteConfig,
                           SelectiveCopyConfig)
from .prepare import load_token_file, prepare
from .registry import DataKind, get, names, register, source_of
from .series import SeriesDataConfig, SeriesSource, read_series
from .subsets import stratified_subset
from .synthetic_series import SyntheticSeriesConfig, SyntheticSeriesSource, synthetic_series
from .text import tokenize_files
from .tokenizer import TokenizerError, load_gpt2_tokenizer
from .windows import (TextDataConfig, TokenFileConfig, TokenWindowConfig, TokenWindowSource, TooShortError,
                      with_tokenizer)

# The Grain pipelines (Grain, JAX) load when first used: the data configs above import without
# them, so a command line checks its config before JAX loads (lpcjax.lazy).
LAZY_IMPORTS = {"pipeline": ("PaddedEvalSource", "make_dataset", "make_iterator", "make_source")}

__all__ = ["DataError", "DataKind", "DelayedIdConfig", "FuzzyRecallConfig", "GeneratedConfig",
           "GeneratedSource", "MQARDataConfig", "MQARSource", "NoisyRecallConfig", "OverwriteConfig",
           "PaddedEvalSource", "SelectiveCopyConfig", "SeriesDataConfig", "SeriesSource", "SyntheticSeriesConfig",
           "SyntheticSeriesSource", "TASK_KINDS", "TextDataConfig", "TokenFileConfig", "TokenWindowConfig",
           "TokenWindowSource", "TokenizerError", "TooShortError",
           "get", "load_gpt2_tokenizer", "load_token_file", "make_dataset", "make_iterator", "make_source",
           "mqar_example", "names", "prepare", "read_series", "register", "source_of", "stratified_subset",
           "synthetic_series", "tokenize_files", "with_tokenizer"]

__getattr__, __dir__ = lazy_exports(__name__, LAZY_IMPORTS)
