"""Build step of the kvsieve package: put libkvsieve.so and the policies into it.

The checkout is the folder above this one, or $KVSIEVE_ROOT. What is bundled:
  kvsieve/lib/libkvsieve.so    $KVSIEVE_LIBRARY if set (an absolute path: pip runs this file in
                               a folder of its own choosing), else the checkout's
                               build/pic/libkvsieve.so.<version> (`make lib`); without either the
                               package is built without it and finds an installed one at run time
                               (kvsieve/_lib.py says where it looks)
  kvsieve/policies/*.lua       the checkout's policies/ (the *.test.lua files left out)
The version is the library's, read from include/kvsieve.h. Because the package carries a
native library, the wheel is tagged for this platform.
"""
import glob
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("KVSIEVE_ROOT") or os.path.join(HERE, ".."))


def version():
    h = open(os.path.join(ROOT, "include", "kvsieve.h")).read()
    return ".".join(re.search(r"#define KS_VERSION_%s +(\d+)" % k, h).group(1) for k in ("MAJOR", "MINOR", "PATCH"))


def library():
    env = os.environ.get("KVSIEVE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise SystemExit("setup.py: KVSIEVE_LIBRARY=%s is not a file" % env)
        return env
    p = os.path.join(ROOT, "build", "pic", "libkvsieve.so." + version())
    return p if os.path.isfile(p) else None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "kvsieve")
        lib = library()
        if lib:
            os.makedirs(os.path.join(dst, "lib"), exist_ok=True)
            shutil.copy2(lib, os.path.join(dst, "lib", "libkvsieve.so"))
            print("setup.py: bundled %s" % lib)
        else:
            print("setup.py: no libkvsieve.so to bundle (run `make lib` first, or set KVSIEVE_LIBRARY); "
                  "the package will look for an installed one")
        pol = [p for p in sorted(glob.glob(os.path.join(ROOT, "policies", "*.lua"))) if not p.endswith(".test.lua")]
        os.makedirs(os.path.join(dst, "policies"), exist_ok=True)
        for p in pol:
            shutil.copy2(p, os.path.join(dst, "policies"))


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithLibrary}, distclass=NativeDistribution)
