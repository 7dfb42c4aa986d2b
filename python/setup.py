"""Builds kvtrim._kvtrim against this checkout's libkvtrim.a and carries
kvtrimd (and libkvtrim-cuda.so where it was built) inside the package, so
`pip install ./python` then `import kvtrim` works without `make install`.

The C library comes from the checkout's build/ (the repository's `make`);
when build/lib/libkvtrim.a or build/bin/kvtrimd is missing, this runs
`make` for them first.  The extension is built against the stable ABI
(abi3, CPython 3.11 and later).
"""
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("KVTRIM_BUILD_DIR", os.path.join(ROOT, "build"))
LIB_A = os.path.join(BUILD, "lib", "libkvtrim.a")
DAEMON = os.path.join(BUILD, "bin", "kvtrimd")
CUDA_LIB = os.path.join(BUILD, "lib", "libkvtrim-cuda.so")


def ensure_built():
    if os.path.exists(LIB_A) and os.path.exists(DAEMON):
        return
    subprocess.check_call(["make", "-C", ROOT, "-j2",
                           os.path.relpath(LIB_A, ROOT),
                           os.path.relpath(DAEMON, ROOT)])


def private_libs():
    """The libraries libkvtrim.a needs (kvtrim.pc's Libs.private)."""
    libs = []
    pc = os.path.join(BUILD, "lib", "kvtrim.pc")
    with open(pc) as f:
        for line in f:
            if line.startswith("Libs.private:"):
                libs = [w[2:] for w in line.split()[1:] if w.startswith("-l")]
    return libs


class BuildPy(build_py):
    """Copies kvtrimd (and libkvtrim-cuda.so) into the package."""

    def run(self):
        super().run()
        ensure_built()
        pkg = os.path.join(self.build_lib, "kvtrim")
        os.makedirs(os.path.join(pkg, "bin"), exist_ok=True)
        shutil.copy2(DAEMON, os.path.join(pkg, "bin", "kvtrimd"))
        if os.path.exists(CUDA_LIB):
            shutil.copy2(CUDA_LIB, os.path.join(pkg, "libkvtrim-cuda.so"))


ensure_built()
setup(
    packages=["kvtrim"],
    cmdclass={"build_py": BuildPy},
    ext_modules=[Extension(
        "kvtrim._kvtrim",
        sources=["kvtrim/_kvtrim.c"],
        include_dirs=[os.path.join(ROOT, "include")],
        extra_objects=[LIB_A],
        # Relinked whenever libkvtrim or its header changed, not only
        # when _kvtrim.c did: a build directory left from an older
        # libkvtrim would otherwise keep its stale copy.
        depends=[LIB_A, os.path.join(ROOT, "include", "kvtrim.h")],
        libraries=private_libs(),
        define_macros=[("Py_LIMITED_API", "0x030B0000")],
        extra_compile_args=["-std=c11", "-Wall", "-Wextra",
                            "-Wno-unused-parameter",
                            "-Wno-missing-field-initializers"],
        py_limited_api=True,
    )],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
