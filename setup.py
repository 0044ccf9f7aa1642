"""Build for Trident: the Python package plus one native extension, trident._C.

The extension is built with torch.utils.cpp_extension against whatever torch is installed
(CPU wheel in CI, CUDA wheel on the GPU machine). It needs no CUDA toolkit: the CUDA driver
API is reached at run time through dlopen("libcuda.so.1"), and streams through torch's
device-generic guard interface. Its types come from the cuda.h Triton's NVIDIA backend ships
(the header Triton's own launcher is compiled against).
"""

import os

import triton
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

SOURCES = [
    "trident/csrc/module.cpp",
    "trident/csrc/scm_runtime.cpp",
    "trident/csrc/cuda_driver.cpp",
    "trident/csrc/aten_fast.cpp",
    "trident/csrc/cublas_lt.cpp",
    "trident/csrc/graph_replay.cpp",
    "trident/csrc/region_call.cpp",
]

setup(
    # name, version, dependencies and the Dynamo backend entry point: pyproject.toml
    packages=find_packages(include=["trident", "trident.*"]),
    py_modules=["trident_scm_backend"],
    package_data={"trident": ["csrc/*.h", "csrc/*.cpp"]},
    ext_modules=[
        CppExtension(
            "trident._C",
            SOURCES,
            extra_compile_args=["-O2"],
            include_dirs=[os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
