"""The named experiments (``--config NAME``), installed as ``lpcjax.configs``: one file each,
with ``get_config()`` (see lpcjax.experiment)."""
