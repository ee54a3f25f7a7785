"""The package's imports run one way (docs/layout.md): no module imports, directly or through
others, a module that imports it, and no library module defers an lpcjax import into a function
to dodge such a loop. Static: every ``import`` statement of lpcjax/ and kernels/ (installed as
lpcjax.kernels), wherever it stands, is an edge, and so is every submodule a package's
``LAZY_IMPORTS`` names (``lpcjax.lazy``: loaded on first use); importing a package means its
__init__."""

import ast
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# Entry points import the library inside main() so that a Ctrl-C or --help comes before JAX's
# import; they sit above everything else and nothing imports them.
ENTRY_POINTS = {"lpcjax.generate", "lpcjax.convert.__main__", "lpcjax.data.__main__", "lpcjax.commands.train",
                "lpcjax.commands.evaluate"}
# Modules that need an optional package (triton) are imported where they are used, so the default
# install imports lpcjax.kernels without it. No cycle is hidden this way: nothing imports back.
OPTIONAL = {("lpcjax.kernels.triton_backend", "lpcjax.kernels.triton_kernels")}


def module_files():
  """{module name: path} of the installed package."""
  out = {}
  for folder, prefix in ((REPO / "lpcjax", "lpcjax"), (REPO / "kernels", "lpcjax.kernels")):
    for path in folder.rglob("*.py"):
      parts = list(path.relative_to(folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join([prefix, *parts])] = path
  return out


def imports_of(name, path, modules):
  """[(target module, deferred)] for every lpcjax import in the file."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  tree = ast.parse(path.read_text())
  top_level = {id(node) for node in tree.body}
  found = []
  for node in tree.body:  # a package's LAZY_IMPORTS (lpcjax.lazy): its submodules, imported on first use
    if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["LAZY_IMPORTS"]
        and name == package):
      found += [(f"{package}.{key.value}", False) for key in node.value.keys if f"{package}.{key.value}" in modules]
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
      continue
    for target in targets:
      if target in modules and target != name:
        found.append((target, id(node) not in top_level))
  return found


def find_cycles(graph):
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return cycles


def graph_of(modules):
  return {name: {t for t, _ in imports_of(name, path, modules)} for name, path in modules.items()}


def test_no_import_cycle():
  cycles = find_cycles(graph_of(module_files()))
  assert not cycles, f"import cycles: {cycles}"


def test_no_deferred_library_import():
  modules = module_files()
  deferred = [(name, target) for name, path in sorted(modules.items()) if name not in ENTRY_POINTS
              for target, inside in imports_of(name, path, modules)
              if inside and (name, target) not in OPTIONAL]
  assert not deferred, f"imports inside functions (move them to the top of the module): {deferred}"


def test_lazy_imports_are_edges(tmp_path):
  """A package's LAZY_IMPORTS table is read as its imports, so a lazily loaded cycle is seen too."""
  package = tmp_path / "__init__.py"
  package.write_text('LAZY_IMPORTS = {"heavy": ("Thing",)}\n')
  modules = {"lpcjax.p": package, "lpcjax.p.heavy": tmp_path / "heavy.py"}
  assert imports_of("lpcjax.p", package, modules) == [("lpcjax.p.heavy", False)]


def test_the_check_sees_a_cycle(tmp_path):
  """The graph code finds a loop when there is one (two modules importing each other)."""
  a, b = tmp_path / "a.py", tmp_path / "b.py"
  a.write_text("from lpcjax.b import x\n")
  b.write_text("def f():\n  import lpcjax.a\n")
  modules = {"lpcjax.a": a, "lpcjax.b": b}
  assert imports_of("lpcjax.a", a, modules) == [("lpcjax.b", False)]
  assert imports_of("lpcjax.b", b, modules) == [("lpcjax.a", True)]
  assert find_cycles(graph_of(modules)) == [["lpcjax.a", "lpcjax.b"]]


# The floors of docs/layout.md, ground floor first: a module imports only modules of its own
# floor or below. The most specific prefix names a module's floor (lpcjax.runs
# sits above the evaluators of its package).
FLOORS = {
    "lpcjax": 1, "lpcjax.errors": 1, "lpcjax.config": 1, "lpcjax.cli": 1, "lpcjax.files": 1,
    "lpcjax.interrupts": 1, "lpcjax.registry": 1, "lpcjax.lazy": 1,
    "lpcjax.kernels": 2,
    "lpcjax.sharding": 3, "lpcjax.layers": 3,
    "lpcjax.data": 4,
    "lpcjax.losses": 5, "lpcjax.decoding": 5, "lpcjax.evaluation": 5,
    "lpcjax.models": 6,
    "lpcjax.experiment": 7, "lpcjax.paper_recipe": 7,
    "lpcjax.training": 8,
    "lpcjax.runs": 9, "lpcjax.convert": 9, "lpcjax.aot": 9,
    "lpcjax.generate": 10, "lpcjax.commands": 10, "lpcjax.convert.__main__": 10, "lpcjax.data.__main__": 10,
}


def floor_of(module):
  prefixes = [p for p in FLOORS if module == p or module.startswith(p + ".")]
  return FLOORS[max(prefixes, key=len)]


def test_imports_run_down_the_floors():
  """No module imports one on a higher floor (docs/layout.md), deferred imports included."""
  modules = module_files()
  upward = [(name, target) for name, path in sorted(modules.items())
            for target, _ in imports_of(name, path, modules)
            if floor_of(target) > floor_of(name) and (name, target) not in OPTIONAL]
  assert not upward, f"imports that run up the floors of docs/layout.md: {upward}"


def test_every_module_has_a_floor():
  assert all(floor_of(name) for name in module_files())


def folder_of(module):
  """The room a module stands in: its package below lpcjax (``lpcjax.models``), or the module
  itself where it is a single file (``lpcjax.runs``)."""
  return ".".join(module.split(".")[:2])


def test_every_folder_stands_on_one_floor():
  """No module of a package has a floor of its own, but the package's entry points (docs/layout.md:
  a package is one room of the house)."""
  special = [p for p in FLOORS if p != folder_of(p) and p not in ENTRY_POINTS]
  assert not special, f"modules given a floor apart from their package: {special}"


def test_folders_import_down_the_floors():
  """Drawn as folders (packages) and arrows, no arrow runs back up and no two folders import
  each other, entry points aside."""
  modules = module_files()
  edges = {(folder_of(name), folder_of(target)) for name, path in modules.items() if name not in ENTRY_POINTS
           for target, _ in imports_of(name, path, modules)
           if folder_of(name) != folder_of(target) and (name, target) not in OPTIONAL}
  upward = sorted((a, b) for a, b in edges if floor_of(b) > floor_of(a))
  mutual = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
  assert not upward and not mutual, f"folders importing up: {upward}; importing each other: {mutual}"


def test_the_floors_check_sees_an_upward_import(tmp_path):
  """A layer importing a family runs up the floors; run loading sits above training and the
  evaluators."""
  layer = tmp_path / "layer.py"
  layer.write_text("from lpcjax.models import fox\n")
  modules = {"lpcjax.layers.layer": layer, "lpcjax.models.fox": tmp_path / "fox.py"}
  (target, _), = imports_of("lpcjax.layers.layer", layer, modules)
  assert floor_of(target) > floor_of("lpcjax.layers.layer")
  assert floor_of("lpcjax.runs") > floor_of("lpcjax.training") > floor_of("lpcjax.evaluation.series")


CONFIG_CHECKS_WITHOUT_JAX = r'''
import contextlib, io, sys
from lpcjax.commands.train import main
for package in ("lpcjax.experiment", "lpcjax.models", "lpcjax.data", "lpcjax.layers", "lpcjax.kernels"):
  __import__(package)
cases = [["model.d_modle=3"], ["--config", "fox_tiny_text", "data.train_files=/no/such/file.txt"],
         ["--config", "lpcsm:tiny", "data.seq_len=100"], [f"train.run_dir={sys.argv[1]}", "train.steps=1"],
         ["model.family=foxx"], ["--config", "pmt", "data.batch_size=1"], ["model.attention_impl=trion"]]
for argv in cases:
  stderr = io.StringIO()
  with contextlib.redirect_stderr(stderr):
    status = main(argv)
  print(status, stderr.getvalue().strip().splitlines()[-1])
print("loaded:", sorted(m for m in ("jax", "flax", "grain", "optax", "orbax", "scipy") if m in sys.modules))
'''


def test_config_errors_answer_before_jax_loads(tmp_path):
  """Bad overrides, a missing data file, an impossible pairing and a run folder under a file are
  one line, exit 2, from train.py's main in a fresh process that never imports JAX (issue #68:
  errors in about a second; benchmarks/cli_errors.py measures the time)."""
  import subprocess
  import sys

  a_file = tmp_path / "a_file"
  a_file.write_text("")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", CONFIG_CHECKS_WITHOUT_JAX, str(a_file)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
  assert result.returncode == 0, result.stderr
  *lines, loaded = result.stdout.strip().splitlines()
  assert [line.split(" ", 1)[0] for line in lines] == ["2"] * 7, lines
  for line, expected in zip(lines, ["model.d_modle: unknown key", "data.train_files: no such file",
                                    "data.seq_len: 100 must be a multiple of model.chunk_size",
                                    "a file stands where a folder is needed", "did you mean fox?",
                                    "data.batch_size: contrastive pre-training needs >= 2",
                                    "unknown backend 'trion' (did you mean triton?)"]):
    assert expected in line, line
  assert loaded == "loaded: []", loaded


def test_a_lazy_package_gives_its_submodules_and_old_names():
  """As before the packages were lazy: a submodule is an attribute of its package, the family
  table's functions import from lpcjax.models.family, and a family written with the fields that
  moved to the config class is one line saying where they went."""
  import sys

  import lpcjax.kernels
  import lpcjax.layers
  import lpcjax.models
  from lpcjax.config import ConfigError
  from lpcjax.models.family import get, register  # noqa: F401
  assert lpcjax.models.fox is sys.modules["lpcjax.models.fox"]
  assert lpcjax.kernels.api is sys.modules["lpcjax.kernels.api"]
  assert lpcjax.layers.attention.ForgettingAttention is lpcjax.layers.ForgettingAttention
  try:
    lpcjax.models.no_such_name
  except AttributeError as error:
    assert "no attribute 'no_such_name'" in str(error)
  else:
    raise AssertionError("an unknown name was given")
  try:
    lpcjax.models.Family("old", lpcjax.models.FoXConfig, None, loss=None, example_inputs=None, evaluator=None,
                         data_kinds=("mqar",))
  except ConfigError as error:
    assert "now class attributes of the family's config class" in str(error)
  else:
    raise AssertionError("the old field was taken")
