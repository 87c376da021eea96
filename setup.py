"""setuptools driving the project's CMake: builds the extension module meshcast._meshcast and
ships python/meshcast with the topology presets (meshes/*.json). See pyproject.toml.

MESHCAST_BUILD_DIR=<dir> reuses a configured CMake build tree (e.g. build/default) instead of
configuring a new one under setuptools' build_temp.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("MESHCAST_BUILD_DIR") or os.path.join(
            os.path.abspath(self.build_temp), "cmake")
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_TESTING=OFF", "-DMESHCAST_BUILD_BENCH=OFF", "-DMESHCAST_BUILD_TOOLS=OFF",
                "-DMESHCAST_WITH_NCCL=OFF", f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build, "--target", "_meshcast", "-j", jobs])
        # Built for this interpreter: its extension suffix (a tree configured for another
        # Python has another one).
        name = "_meshcast" + sysconfig.get_config_var("EXT_SUFFIX")
        built = glob.glob(os.path.join(build, "python", "meshcast", name))
        if len(built) != 1:
            raise RuntimeError(f"no {name} in {build}/python/meshcast: was the tree configured "
                               f"with -DPython3_EXECUTABLE={sys.executable}?")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built[0], target)


class BuildPy(build_py):
    """The package's files, plus the topology presets under meshcast/meshes."""

    def run(self):
        super().run()
        presets = os.path.join(self.build_lib, "meshcast", "meshes")
        os.makedirs(presets, exist_ok=True)
        for f in glob.glob(os.path.join(ROOT, "meshes", "*.json")):
            shutil.copy2(f, presets)


setup(
    packages=["meshcast"],
    package_dir={"": "python"},
    package_data={"meshcast": ["__init__.pyi", "py.typed"]},
    ext_modules=[Extension("meshcast._meshcast", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    zip_safe=False,
)
