from onceflow.cli import main

main()
