"""`wirl/_native.pyi` held to the extension module it describes, both ways: every public
name of `wirl._native` is in the stub and every name of the stub is in the module; each
function's and method's parameters (names, order, defaults) are the module's own signature;
each class attribute the stub lists is a property of the class. The types are the stub's
(the module's signatures carry none); everything else a change to `python/src` can move is
checked here, so the stub cannot drift from the module."""

import ast
import inspect
import pathlib

import wirl._native as native

# The checkout's stub (the one edited), else the installed package's.
CANDIDATES = [
    pathlib.Path(__file__).parents[1] / "wirl" / "_native.pyi",
    pathlib.Path(native.__file__).with_name("_native.pyi"),
]
STUB = next(path for path in CANDIDATES if path.is_file())


def stub_tree():
    return ast.parse(STUB.read_text())


def public(names):
    return {n for n in names if not n.startswith("_")}


def stub_parameters(function: ast.FunctionDef):
    """(name, default as Python source or None) of a stub's `def`, `self` left out."""
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    pairs = list(zip([a.arg for a in positional], defaults))
    pairs += [(a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return [(name, default) for name, default in pairs if name != "self"]


def module_parameters(obj):
    """(name, default as Python source or None) of the module's own signature."""
    signature = inspect.signature(obj)
    return [
        (name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for name, p in signature.parameters.items()
        if name != "self"
    ]


def test_the_stub_names_what_the_module_has_and_nothing_else():
    tree = stub_tree()
    named = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            named.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named.add(node.target.id)
    # Type aliases of the stub (`_Scored = ...`) are its own, not the module's.
    assert public(named) == public(dir(native)), (
        f"only in the stub: {sorted(public(named) - public(dir(native)))}; "
        f"only in the module: {sorted(public(dir(native)) - public(named))}"
    )


def test_every_signature_and_attribute_is_the_modules():
    checked = 0
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            assert stub_parameters(node) == module_parameters(getattr(native, node.name)), node.name
            checked += 1
        if not isinstance(node, ast.ClassDef) or node.name == "PluginError":
            continue
        cls = getattr(native, node.name)
        members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        attributes = {m.target.id for m in node.body if isinstance(m, ast.AnnAssign)}
        if "__init__" in members:
            assert stub_parameters(members.pop("__init__")) == module_parameters(cls), f"{node.name}()"
            checked += 1
        for name, method in members.items():
            assert stub_parameters(method) == module_parameters(getattr(cls, name)), f"{node.name}.{name}"
            checked += 1
        properties = {n for n, v in vars(cls).items() if inspect.isgetsetdescriptor(v)}
        methods = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        assert attributes == public(properties), f"{node.name}: attributes {sorted(attributes)} vs {sorted(properties)}"
        assert set(members) == methods, f"{node.name}: methods {sorted(members)} vs {sorted(methods)}"
    # A stub parsed into nothing would pass the loops above.
    assert checked >= 10


def test_a_drifted_stub_is_caught(tmp_path):
    """The check itself fails on a stub whose parameter was renamed or lost its default."""
    renamed = ast.parse("def set_worker_command(program, argv): ...").body[0]
    assert stub_parameters(renamed) != module_parameters(native.set_worker_command)
    no_default = ast.parse("def score(self, batch_json, step, steps=0): ...").body[0]
    assert stub_parameters(no_default) != module_parameters(native.NativeReward.score)
