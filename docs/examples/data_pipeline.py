"""The usage guide's "Complete Example: Data Processing Pipeline".

Unchanged except for the two registry host names in ``allowed_domains``: they are read from
this machine's pip configuration (``PYPI_HOSTS``), because harombe never writes a registry's
host name into its files.
"""

import asyncio
from urllib.parse import urlparse

from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


def _pypi_hosts():
    from pip._internal.models.index import PyPI

    return [PyPI.netloc, urlparse(PyPI.file_storage_domain).netloc or PyPI.file_storage_domain]


PYPI_HOSTS = _pypi_hosts()


async def data_processing_pipeline():
    """Example data processing pipeline using code sandbox."""
    # Setup
    docker_manager = DockerManager()
    await docker_manager.start()
    sandbox_manager = SandboxManager(
        docker_manager=docker_manager,
        runtime="runsc",
        max_memory_mb=1024,  # 1GB for data processing
    )
    await sandbox_manager.start()
    tools = CodeExecutionTools(sandbox_manager=sandbox_manager)
    try:
        # Step 1: Create sandbox and install pandas
        print("Step 1: Setting up environment...")
        result = await tools.code_execute(
            language="python",
            code="print('Environment ready')",
            network_enabled=True,
            allowed_domains=PYPI_HOSTS,
        )
        sandbox_id = result['sandbox_id']
        await tools.code_install_package(
            sandbox_id=sandbox_id,
            package="pandas==2.0.0",
            registry="pypi",
        )
        # Step 2: Write input data
        print("Step 2: Writing input data...")
        await tools.code_write_file(
            sandbox_id=sandbox_id,
            file_path="data/sales.csv",
            content="""
date,product,amount
2024-01-01,Widget,100
2024-01-02,Gadget,150
2024-01-03,Widget,200
2024-01-04,Gadget,175
""".strip(),
        )
        # Step 3: Process data
        print("Step 3: Processing data...")
        result = await tools.code_execute(
            language="python",
            code="""
import pandas as pd
# Read data
df = pd.read_csv('/workspace/data/sales.csv')
# Calculate statistics
total_sales = df['amount'].sum()
avg_sales = df['amount'].mean()
product_totals = df.groupby('product')['amount'].sum()
# Write results
with open('/workspace/results.txt', 'w') as f:
    f.write(f"Total Sales: ${total_sales}\\n")
    f.write(f"Average Sale: ${avg_sales:.2f}\\n")
    f.write("\\nSales by Product:\\n")
    for product, total in product_totals.items():
        f.write(f" {product}: ${total}\\n")
print("Processing complete!")
""",
            sandbox_id=sandbox_id,
            timeout=60,
        )
        print(f"Output: {result['stdout']}")
        # Step 4: Read results
        print("Step 4: Reading results...")
        result = await tools.code_read_file(
            sandbox_id=sandbox_id,
            file_path="results.txt",
        )
        print(f"Results:\n{result['content']}")
        # Step 5: List all files
        print("Step 5: Listing generated files...")
        result = await tools.code_list_files(
            sandbox_id=sandbox_id,
            path=".",
        )
        print(f"Files created: {result['files']}")
        # Cleanup
        print("Cleaning up...")
        await tools.code_destroy_sandbox(sandbox_id)
    finally:
        await sandbox_manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    asyncio.run(data_processing_pipeline())
