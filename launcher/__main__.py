from launcher.main import main

main()
