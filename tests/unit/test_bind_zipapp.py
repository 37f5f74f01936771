"""heteroserve-bind as one zipapp for engine images heteroserve does not build: it holds every
module it imports, imports nothing but the standard library besides them, and parses as the
oldest Python it says it runs on."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
import zipfile

from heteroserve_engines.bind import zipapp


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of what `source` (a module of `package`) imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module != "__future__":
                names.add(node.module)
    return names


def test_the_zipapp_holds_everything_it_imports_and_nothing_else_but_the_stdlib():
    root = zipapp.package_root()
    bundled = {name.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")
               for name in zipapp.MODULES}
    for name in zipapp.MODULES:
        package = name.rsplit("/", 1)[0].replace("/", ".")
        for module in imported_modules((root / name).read_text(), package):
            top = module.split(".")[0]
            assert module in bundled or top in sys.stdlib_module_names, (name, module)


def test_every_module_parses_as_python_3_8():
    root = zipapp.package_root()
    sources = [(name, (root / name).read_text()) for name in zipapp.MODULES]
    sources.append(("__main__.py", zipapp.ENTRY))
    for name, source in sources:
        ast.parse(source, filename=name, feature_version=zipapp.MINIMUM_PYTHON)


def test_the_built_zipapp_is_executable_and_runs_without_site_packages(tmp_path):
    target = zipapp.build(tmp_path / "deep" / "heteroserve-bind.pyz")
    assert target.read_bytes().startswith(zipapp.SHEBANG)
    assert target.stat().st_mode & stat.S_IXUSR
    with zipfile.ZipFile(target) as archive:
        assert sorted(archive.namelist()) == sorted([*zipapp.MODULES, "__main__.py"])
    # -I -S: no site-packages, no PYTHONPATH: only the zipapp and the standard library.
    done = subprocess.run([sys.executable, "-I", "-S", str(target), "--help"], check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: heteroserve-bind [options] -- <engine command...>")
    # No partial file is left beside it.
    assert [p.name for p in target.parent.iterdir()] == ["heteroserve-bind.pyz"]
