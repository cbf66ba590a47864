"""The type stubs (python/memplug.pyi, shipped in the wheel with py.typed)
name exactly what the extension module has: its classes, their methods and
properties, their parameters, its constants, and the choices of
`on_read_only`."""
import ast
import inspect
import pathlib

import pytest

import memplug

STUB = pathlib.Path(__file__).resolve().parents[1] / "memplug.pyi"
# Dunders the stubs describe (the protocol methods users call through).
DUNDERS = {"__dlpack__", "__dlpack_device__", "__enter__", "__exit__", "__len__"}


def stub_tree():
    return ast.parse(STUB.read_text())


def stub_classes(tree):
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def stub_members(classes, name):
    """Methods and properties of stub class `name`, its stub-only private
    bases (`_Memory`, `_Exportable`) included: {name: FunctionDef}."""
    node = classes[name]
    members = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id.startswith("_") and base.id in classes:
            members.update(stub_members(classes, base.id))
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            members[item.name] = item
    return members


def module_names():
    return {n for n in dir(memplug) if not n.startswith("_")} | {"__version__"}


def stub_names(tree):
    names = set()
    for n in tree.body:
        if isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
            names.add(n.name)
        elif isinstance(n, ast.AnnAssign):
            names.add(n.target.id)
    # Plain assignments (`DType = Any`) are type aliases of the stubs only.
    return names


def test_the_stub_names_every_module_name_and_no_other():
    tree = stub_tree()
    missing = module_names() - stub_names(tree) - {"memplug"}
    extra = stub_names(tree) - module_names()
    assert not missing, f"in the module, not in {STUB.name}: {sorted(missing)}"
    assert not extra, f"in {STUB.name}, not in the module: {sorted(extra)}"


def test_each_class_has_the_stub_s_members_and_parameters():
    classes = stub_classes(stub_tree())
    for name, cls in vars(memplug).items():
        if not isinstance(cls, type) or name.startswith("_"):
            continue
        if issubclass(cls, BaseException):
            base = classes[name].bases[0].id
            assert cls.__mro__[1].__name__ == base, f"{name} derives from {cls.__mro__[1].__name__}, not {base}"
            continue
        real = {k for k in vars(cls) if not k.startswith("_") or k in DUNDERS}
        stub = set(stub_members(classes, name)) - {"__init__"}
        assert real == stub, f"{name}: only in the module {sorted(real - stub)}, only in the stub {sorted(stub - real)}"
        for member, fn in stub_members(classes, name).items():
            attr = vars(cls).get(member)
            if member in ("__exit__", "__init__") or attr is None or not callable(attr):
                continue
            params = list(inspect.signature(attr).parameters)[1:]  # past self
            args = fn.args
            listed = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs][1:]
            assert params == listed, f"{name}.{member}: the module takes {params}, the stub {listed}"


def test_on_read_only_choices_agree():
    tree = stub_tree()
    alias = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "OnReadOnly")
    choices = [e.value for e in alias.value.slice.elts]
    m = memplug.Manager()
    m.register_cpu_plugin()
    a = m.bind(m.select("cpu"), m.create_pool("p", 1 << 20)).allocate(4096)
    with pytest.raises(ValueError) as e:
        a.view(16, on_read_only="no-such-choice")
    msg = str(e.value)
    at = [msg.find(f'"{c}"') for c in choices]
    assert -1 not in at and at == sorted(at), f"the stub's {choices}, the module's: {msg}"
    assert a.view(16).on_read_only == choices[0], "the default is the first choice"


def test_the_wheel_ships_the_stub_and_py_typed():
    pkg = pathlib.Path(memplug.__file__).parent
    assert (pkg / "py.typed").is_file(), f"no py.typed in {pkg}"
    shipped = pkg / "__init__.pyi"
    assert shipped.is_file(), f"no __init__.pyi in {pkg}"
    assert shipped.read_text() == STUB.read_text(), "the installed stub is not python/memplug.pyi: rebuild the wheel"
