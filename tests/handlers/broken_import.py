raise ImportError("this handler module needs a package that is not installed")
