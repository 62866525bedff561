"""python -m cachealloc: what pip install built here."""
from . import _native


def main():
    print("cachealloc-analyze: %s" % ("installed" if _native.cli_path().exists() else "missing"))
    print("the torch extension: %s" % _native.extension_status())


if __name__ == "__main__":
    main()
