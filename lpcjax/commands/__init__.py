"""The command lines, installed as console scripts: ``lpcjax-train`` (``train``), ``lpcjax-eval``
(``evaluate``) and ``lpcjax-generate`` (``lpcjax.generate``). The checkout's train.py and eval.py
are thin wrappers of the first two. Each imports the library inside ``main()``, so a Ctrl-C or
``--help`` comes before JAX loads."""
